"""Assignment a4, graded (1 of 3): what each request is charged (Lessons 5, 8, 10 and 13).

Graded by mechanism (`assignments.A4_RUBRIC`): exact counters against Algorithm 2's and
Algorithm 3's arithmetic on small hand-built cases, under the linear and the profiled cost,
with and without a predictor, a prefix cache (w_c), weights and a preemption: the prompt
charge at dispatch, the output charges, the prediction and its refund, every charge divided by
the client's weight. The pick and the lift are `test_a4_pick.py`'s; the theorems on workloads,
`test_a4_theorems.py`'s. Requests are moved as the engine moves them (`vtc_moves.py`)."""

from __future__ import annotations

import pytest

from minivtc.course.graded.driver import W_P, W_Q, admission_round
from minivtc.course.graded.vtc_moves import (
    Fixed,
    Recording,
    decode,
    dispatch_next,
    finish,
    preempt,
    request,
)
from minivtc.fairness.cost import PAPER_COST, ProfiledCost
from minivtc.fairness.predictors import Oracle
from minivtc.fairness.vtc import VTC
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request


def test_dispatch_charges_the_prompt_at_once():
    """dispatch charges the prompt, h(n_p, 0), to its client's counter at once."""
    vtc = VTC()
    vtc.add(request("a", 10), 0.0)
    dispatch_next(vtc)
    assert vtc.counters["a"] == W_P * 10, (
        f"after dispatching a 10-token prompt the counter is {vtc.counters['a']}, not "
        f"h(10, 0) = {W_P * 10}"
    )


def test_a_cached_prompt_is_charged_at_the_cached_weight():
    """A prompt's tokens found in the prefix cache cost w_c each at dispatch, not w_p."""
    vtc = VTC(cached_weight=0.25)
    r = request("a", 10)
    vtc.add(r, 0.0)
    r.num_cached = 6  # (admission sets it before dispatch)
    dispatch_next(vtc)
    expected = W_P * 4 + 0.25 * 6
    assert vtc.counters["a"] == pytest.approx(expected), (
        f"10 prompt tokens, 6 of them cached at w_c = 0.25: the counter is {vtc.counters['a']}, "
        f"not {expected} (cost.cache_discount)"
    )


def test_a_request_back_from_a_preemption_is_not_charged_again():
    """A preempted request dispatched again is not charged for its prompt a second time."""
    vtc = VTC()
    r = request("a", 10)
    vtc.add(r, 0.0)
    dispatch_next(vtc)
    preempt(vtc, r)
    dispatch_next(vtc)
    assert vtc.counters["a"] == W_P * 10, (
        f"the prompt was charged again on readmission: counter {vtc.counters['a']}, not "
        f"{W_P * 10} (VTC.dispatch: a request with num_preemptions > 0 was charged already)"
    )


def test_dispatch_charges_the_prompt_at_once_under_the_profiled_cost():
    """Under any cost h (here the profiled one), dispatch charges h(n_p, 0), not w_p n_p."""
    h = ProfiledCost()
    vtc = VTC(cost=h)
    vtc.add(request("a", 10), 0.0)
    dispatch_next(vtc)
    assert vtc.counters["a"] == pytest.approx(h(10, 0)), (
        f"after dispatching a 10-token prompt under the profiled cost the counter is "
        f"{vtc.counters['a']:.4f}, not h(10, 0) = {h(10, 0):.4f} (VTC.dispatch: charge "
        "self.cost(n_p, predicted), whatever h is)"
    )


def test_each_output_token_is_charged_to_its_own_client():
    """A step that decodes several clients' requests charges each token to its own client."""
    vtc = VTC()
    ra, rb = request("a", 10), request("b", 4)
    for r in (ra, rb):
        vtc.add(r, 0.0)
    dispatch_next(vtc), dispatch_next(vtc)  # a: 10, b: 4
    for _ in range(3):
        for r in (ra, rb):
            r.output_ids.append(1)
        vtc.on_decode([ra, rb])
    got = {c: vtc.counters[c] for c in "ab"}
    want = {"a": W_P * 10 + W_Q * 3, "b": W_P * 4 + W_Q * 3}
    assert got == want, (
        f"a (10 prompt tokens) and b (4) decoded 3 tokens each, in the same steps: counters "
        f"{got}, not {want} (VTC.charge_outputs: each request's tokens go to its own client)"
    )


def test_the_predictor_learns_each_finished_request_and_no_aborted_one():
    """on_finish teaches the predictor the finished request's length (not an aborted one's)."""
    predictor = Recording()
    vtc = VTC(predictor=predictor)
    done, aborted = request("a", 4, name="done"), request("b", 4, name="aborted")
    for r in (done, aborted):
        vtc.add(r, 0.0)
        dispatch_next(vtc)
    decode(vtc, done, 3)
    finish(vtc, done, "eos")
    finish(vtc, aborted, "abort")
    assert predictor.observed == ["done"], (
        f"predictor.observe was called for {predictor.observed}, not for the finished request "
        "only (Algorithm 3 learns from each finished request)"
    )


def test_output_charges_follow_any_cost_the_profiled_one_too():
    """With any cost h (here the profiled one), n_q output tokens cost h(n_p, n_q) in all."""
    h = ProfiledCost()
    vtc = VTC(cost=h)
    r = request("a", 10)
    vtc.add(r, 0.0)
    dispatch_next(vtc)
    for n in range(1, 6):
        decode(vtc, r, 1)
        assert vtc.counters["a"] == pytest.approx(h(10, n)), (
            f"after {n} output tokens of a 10-token prompt the counter is {vtc.counters['a']:.4f}"
            f", not h(10, {n}) = {h(10, n):.4f} (the n-th token costs h(n_p, n) - h(n_p, n - 1))"
        )


def test_an_over_predicted_length_is_refunded():
    """Algorithm 3: charge h(n_p, predicted) at dispatch, refund what was not generated."""
    vtc = VTC(predictor=Oracle())
    r = Request("r", "a", [1] * 10, SamplingParams(max_tokens=50), 0.0)
    vtc.add(r, 0.0)
    admission_round(vtc, lambda req: True)
    predicted = W_P * 10 + W_Q * 50
    assert vtc.counters["a"] == predicted, (
        f"a 10-token prompt predicted to give 50 tokens: the counter after dispatch is "
        f"{vtc.counters['a']}, not h(10, 50) = {predicted} (Algorithm 3 charges the prediction "
        "at dispatch)"
    )
    r.output_ids += [1] * 20
    vtc.on_decode([r])
    assert vtc.counters["a"] == predicted, (
        f"20 tokens generated, within the 50 predicted: the counter moved to {vtc.counters['a']}"
        f" from {predicted} (VTC.charge_outputs: nothing more until n_q passes the prediction)"
    )
    finish(vtc, r, "eos")
    assert vtc.counters["a"] == W_P * 10 + W_Q * 20, (
        f"finished after 20 of the 50 predicted tokens: the counter is {vtc.counters['a']}, "
        f"not h(10, 20) = {W_P * 10 + W_Q * 20} (VTC.on_finish refunds h(n_p, predicted) - "
        "h(n_p, n_q), the output charged but never generated)"
    )


def test_a_refund_may_take_a_counter_below_the_waiting_ones():
    """Algorithm 3's refund is a charge of h(n_p, n_q) - h(n_p, predicted), not stopped at the
    smallest waiting counter: a refunded client may fall below a client that waits."""
    vtc = VTC(predictor=Fixed(50.0))
    r = request("a", 10)
    vtc.add(r, 0.0)
    vtc.add(request("b", 150, name="b1"), 0.0)
    vtc.add(request("b", 150, name="b2"), 0.0)
    dispatch_next(vtc), dispatch_next(vtc)  # a: h(10, 50); b: h(150, 50), and b2 waits
    waiting = vtc.counters["b"]
    decode(vtc, r, 20)
    finish(vtc, r, "eos")
    assert vtc.counters["a"] == W_P * 10 + W_Q * 20 < waiting, (
        f"a, predicted 50 tokens, finished after 20 while b waited at {waiting}: a's counter is "
        f"{vtc.counters['a']}, not h(10, 20) = {W_P * 10 + W_Q * 20} (VTC.on_finish: the "
        "refund is a charge, `charge`, not `lower`, which stops at the smallest waiting "
        "counter: Algorithm 3 refunds the whole over-prediction, Lesson 8)"
    )


@pytest.mark.parametrize("cost", [PAPER_COST, ProfiledCost()], ids=["linear", "profiled"])
@pytest.mark.parametrize(
    "predictor", [None, Oracle(), Fixed(8.0), Fixed(0.5)], ids=["none", "oracle", "8", "0.5"]
)
def test_a_request_costs_h_in_the_end_whatever_the_cost_and_the_prediction(cost, predictor):
    """A finished request has cost its client exactly h(n_p, n_q), whatever h and whatever
    was predicted: h(n_p, predicted) at dispatch, each token past the prediction, the refund."""
    vtc = VTC(cost=cost, predictor=predictor)
    total = 0.0
    for i, (n_p, n_q) in enumerate([(10, 30), (5, 3), (20, 8), (1, 100), (100, 20)]):
        r = request("a", n_p, n_q, name=f"r{i}")
        vtc.add(r, 0.0)
        before = vtc.counters["a"]
        dispatch_next(vtc)
        guess = predictor.predict(r) if isinstance(predictor, (Fixed, Oracle)) else 0.0
        charged = vtc.counters["a"] - before
        assert charged == pytest.approx(cost(n_p, guess)), (
            f"request {i} ({n_p} prompt tokens, predicted {guess:g}): dispatch charged "
            f"{charged:.4f}, not h({n_p}, {guess:g}) = {cost(n_p, guess):.4f} (VTC.dispatch: "
            "the cost h of the prompt and the prediction, whatever h is)"
        )
        decode(vtc, r, n_q)
        finish(vtc, r, "length")
        total += cost(n_p, n_q)
        assert vtc.counters["a"] == pytest.approx(total), (
            f"after request {i} ({n_p} prompt, {n_q} output tokens, predicted {guess:g}) the "
            f"counter is {vtc.counters['a']:.4f}, not the sum of h(n_p, n_q) = {total:.4f} "
            "(each token past the prediction costs h(n_p, n_q) - h(n_p, n_q - 1); the refund is "
            "h(n_p, predicted) - h(n_p, n_q), not w_q (predicted - n_q))"
        )


def test_every_charge_is_divided_by_the_client_s_weight():
    """A client of weight 2 is charged half of every cost: the prompt, the outputs, the
    prediction and its refund (Section 4.3)."""
    vtc = VTC(weights={"a": 2.0})
    r = request("a", 10)
    vtc.add(r, 0.0)
    dispatch_next(vtc)
    assert vtc.counters["a"] == W_P * 10 / 2, (
        f"weight 2, a 10-token prompt dispatched: counter {vtc.counters['a']}, not "
        f"h(10, 0) / 2 = {W_P * 10 / 2} (VTC.dispatch divides by the weight)"
    )
    decode(vtc, r, 3)
    assert vtc.counters["a"] == (W_P * 10 + W_Q * 3) / 2, (
        f"weight 2, 3 tokens generated: counter {vtc.counters['a']}, not h(10, 3) / 2 = "
        f"{(W_P * 10 + W_Q * 3) / 2} (VTC.charge_outputs divides by the weight)"
    )
    vtc = VTC(weights={"a": 2.0}, predictor=Fixed(8.0))
    r = request("a", 10)
    vtc.add(r, 0.0)
    dispatch_next(vtc)
    decode(vtc, r, 3)
    finish(vtc, r)
    assert vtc.counters["a"] == (W_P * 10 + W_Q * 3) / 2, (
        f"weight 2, 8 tokens predicted, 3 generated: counter {vtc.counters['a']} at the end, "
        f"not h(10, 3) / 2 = {(W_P * 10 + W_Q * 3) / 2} (the refund is divided by the weight "
        "too)"
    )
