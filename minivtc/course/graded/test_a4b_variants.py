"""Assignment a4b, graded (1 of 2): VTC's variants of Lesson 8, on a4's VTC.

Graded by mechanism (`assignments.A4B_RUBRIC`): exact counters against Algorithm 2's and
Algorithm 3's arithmetic on small hand-built cases, and weighted VTC on workloads: the profiled
cost h (Section 4.2) on the prompt and on every output token, length prediction and its refund
(Algorithm 3, Section 4.4), and weights (Section 4.3) on every charge, within the bound and in
proportion. Requests are moved as the engine moves them (`vtc_moves.py`)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from minivtc.course.graded.driver import (
    W_P,
    W_Q,
    Arrival,
    admission_round,
    bound_u,
    first_over,
    max_gap,
    random_arrivals,
    workloads,
)
from minivtc.course.graded.test_a4_theorems import PROPERTY, replay
from minivtc.course.graded.testbed import serve
from minivtc.course.graded.vtc_moves import (
    Fixed,
    Recording,
    decode,
    dispatch_next,
    finish,
    request,
)
from minivtc.fairness.cost import PAPER_COST, ProfiledCost
from minivtc.fairness.predictors import Oracle
from minivtc.fairness.vtc import VTC
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request

__all__ = []


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


def test_a_refunded_client_is_picked_by_its_new_counter():
    """A refund lowers a waiting client's counter: the next pick reads the lowered counter."""
    vtc = VTC(predictor=Fixed(50.0))
    r = request("a", 30)
    for req in (r, request("b", 10, name="b1"), request("b", 10, name="b2")):
        vtc.add(req, 0.0)
    dispatch_next(vtc), dispatch_next(vtc)  # a: h(30, 50) = 130; b: h(10, 50) = 110, b2 waits
    vtc.add(request("a", 5, name="a2"), 0.0)  # a waits too, above b: no lift
    r.output_ids.extend([1] * 20)
    finish(vtc, r, "eos")  # refunded to h(30, 20) = 70, below b's 110
    picked = dispatch_next(vtc).request_id
    assert picked == "a2", (
        f"a was refunded to {vtc.counters['a']} while its a2 waited, b2 waiting at "
        f"{vtc.counters['b']}: picked {picked}, not a2 (a counter that falls must be seen by "
        "the next pick: VTC.charge and the counter structure, LeastCounter.push)"
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


@settings(PROPERTY, max_examples=30)
@given(workloads)
def test_weighted_vtc_follows_weights_within_the_bound(w):
    """Weighted VTC: two backlogged clients' weighted service stays within 2U, on random
    workloads."""
    arrivals = random_arrivals(w)
    weights = {f"c{i}": float(i + 1) for i in range(w["n_clients"])}
    u = bound_u(max(a.prompt for a in arrivals), w["kv_tokens"])  # weights >= 1: U/min_w <= U
    engine, steps, _ = replay(VTC(weights=weights), w)
    for f in weights:
        for g in weights:
            if f < g:
                gap = max_gap(steps, f, g, weights)
                assert gap <= 2 * u, (
                    f"{f} and {g} (weights {weights[f]}, {weights[g]}) both backlogged: weighted "
                    f"service gap {gap} > 2U = {2 * u}, first at step "
                    f"{first_over(steps, f, g, 2 * u, weights)}; replay: random_arrivals({w}); "
                    "could be: a charge not divided by the client's weight (dispatch, "
                    "charge_outputs, the refund), or the lift"
                )


def test_weighted_vtc_shares_are_proportional_when_all_are_backlogged():
    """Weighted VTC: clients always backlogged get service in proportion to their weights."""
    weights = {"a": 1.0, "b": 2.0, "c": 4.0}
    arrivals = [Arrival(0.0, c, 10, 10) for c in weights for _ in range(150)]
    _, steps, _ = serve(VTC(weights=weights), arrivals, kv_tokens=100)
    busy = [s for s in steps if s.backlogged == set(weights)]
    total = {c: sum(s.service.get(c, 0.0) for s in busy) for c in weights}
    shares = (
        f"service of a, b, c (weights 1, 2, 4), all backlogged: {total}, not in proportion 1:2:4 "
        "within 10% (every charge is divided by the client's weight)"
    )
    assert total["b"] / total["a"] == pytest.approx(2.0, rel=0.1), shares
    assert total["c"] / total["a"] == pytest.approx(4.0, rel=0.1), shares
