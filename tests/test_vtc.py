"""VTC (Algorithm 2), its selection structure and the artifact's variant, through the hooks the
engine calls: no model and no engine, except where a test drives the real step loop.

The theorems, which need whole workloads, are `test_scheduler.py`'s.
"""

from __future__ import annotations

import random

import pytest

from minivtc.core.cost import LinearCost, ProfiledCost
from minivtc.core.policies import make_scheduler
from minivtc.core.predictors import MeanOfLast, MovingAverage, Oracle
from minivtc.core.request import Request
from minivtc.core.sampler import SamplingParams
from minivtc.core.vtc import VTC, ArtifactVTC
from tests.test_scheduler import Arrival, drive

W_P, W_Q = 1.0, 2.0  # the paper's weights


def test_heap_selection_equals_brute_force_scan():
    rng = random.Random(0)
    for trial in range(30):
        vtc = VTC(lift=rng.random() < 0.5)
        reqs = []
        for i in range(200):
            op = rng.random()
            if op < 0.5:
                r = Request(f"r{trial}-{i}", f"c{rng.randint(0, 9)}", [1] * rng.randint(1, 9),
                            SamplingParams(max_tokens=4), 0.0)  # fmt: skip
                vtc.add(r, 0.0)
                reqs.append(r)
            elif op < 0.8 and reqs:
                r = rng.choice(reqs)
                r.output_ids.append(1)
                # Mostly charges; sometimes a refund, which lowers a counter below its heap key.
                vtc.charge(
                    r.client_id, rng.uniform(-3, 5) if rng.random() < 0.2 else rng.uniform(0, 5)
                )
            else:
                budget = [rng.randint(0, 3)]

                def admit(r, budget=budget, vtc=vtc):
                    budget[0] -= 1
                    if budget[0] < 0:
                        return False
                    vtc.on_tokens(r, r.num_prompt, 0)
                    return True

                vtc.schedule(admit)
            waiting = [c for c, q in vtc.queues.items() if q]
            brute = min(waiting, key=lambda c: (vtc.counters[c], vtc.first_seen[c]), default=None)
            assert vtc.least.least() == brute
            vtc.check_invariants()


@pytest.mark.parametrize(
    "name", ["vtc", "vtc-artifact", "vtc-predict", "vtc-oracle:0.5", "vtc-profile", "lcf"]
)
def test_on_decode_charges_exactly_as_one_on_tokens_per_request(name):
    """The engine's per-step hook (one call per step) equals the plain per-request hook."""
    rng = random.Random(1)
    batched, plain = make_scheduler(name, seed=3), make_scheduler(name, seed=3)
    twins = []
    for i in range(40):
        client, n_p, n_q = f"c{rng.randint(0, 4)}", rng.randint(1, 30), rng.randint(1, 12)
        pair = [Request(f"r{i}", client, [1] * n_p, SamplingParams(max_tokens=n_q), 0.0)
                for _ in (batched, plain)]  # fmt: skip
        for vtc, r in zip((batched, plain), pair, strict=True):
            vtc.add(r, 0.0)
            vtc.schedule(lambda req, vtc=vtc: vtc.on_tokens(req, req.num_prompt, 0) or True)
        twins.append(pair)
    while twins:
        for pair in twins:
            for r in pair:
                r.output_ids.append(1)
        batched.on_decode([a for a, _ in twins])
        for _, b in twins:
            plain.on_tokens(b, 0, 1)
        for pair in [p for p in twins if p[0].num_output == p[0].params.max_tokens]:
            twins.remove(pair)
            for vtc, r in zip((batched, plain), pair, strict=True):
                r.finish_reason = "length"
                vtc.on_finish(r)
        assert batched.counters == plain.counters


def finished(vtc, client, n_p, n_q, rid="x"):
    """Run one request through the hooks as the engine would: dispatch, n_q tokens, finish."""
    r = Request(rid, client, [1] * n_p, SamplingParams(max_tokens=n_q), 0.0)
    vtc.add(r, 0.0)
    vtc.schedule(lambda req: vtc.on_tokens(req, req.num_prompt, 0) or True)
    for _ in range(n_q):
        r.output_ids.append(1)
        vtc.on_tokens(r, 0, 1)
    r.finish_reason = "length"
    vtc.on_finish(r)
    return r


@pytest.mark.parametrize("cost", [LinearCost(), ProfiledCost()])
@pytest.mark.parametrize(
    "predictor", [None, MeanOfLast(), MovingAverage(), Oracle(), Oracle(0.5, seed=1)]
)
def test_total_charge_is_the_cost_whatever_the_prediction(cost, predictor):
    """Charges are incremental (h(n_p, n_q) - h(n_p, n_q - 1)), over-prediction is refunded:
    a finished request has cost exactly h(n_p, n_q) in the end."""
    vtc = VTC(cost=cost, predictor=predictor)
    total = 0.0
    for i, (n_p, n_q) in enumerate([(10, 30), (5, 50), (20, 3), (7, 7), (1, 100)]):
        finished(vtc, "a", n_p, n_q, rid=f"r{i}")
        total += cost(n_p, n_q)
        assert vtc.counters["a"] == pytest.approx(total)


def test_prediction_is_charged_at_dispatch():
    vtc = VTC(predictor=Oracle())
    r = Request("x", "a", [1] * 10, SamplingParams(max_tokens=40), 0.0)
    vtc.add(r, 0.0)
    vtc.schedule(lambda req: vtc.on_tokens(req, req.num_prompt, 0) or True)
    assert vtc.counters["a"] == W_P * 10 + W_Q * 40  # the whole cost up front (the oracle)


def test_lift_rules():
    vtc = VTC()
    finished(vtc, "a", 10, 10, rid="a1")  # a's counter: 30; a left Q last
    b = Request("b1", "b", [1], SamplingParams(), 0.0)
    vtc.add(b, 0.0)  # Q empty: b is lifted to the last client that left Q
    assert vtc.counters["b"] == 30
    c = Request("c1", "c", [1], SamplingParams(), 0.0)
    vtc.add(c, 0.0)  # Q = {b}: c is lifted to the minimum waiting counter
    assert vtc.counters["c"] == 30
    artifact = ArtifactVTC()
    finished(artifact, "a", 10, 10)
    artifact.add(Request("b1", "b", [1], SamplingParams(), 0.0), 0.0)
    assert artifact.counters["b"] == 0  # the artifact only lifts against waiting clients
    lcf = VTC(lift=False)
    finished(lcf, "a", 10, 10)
    lcf.add(Request("b1", "b", [1], SamplingParams(), 0.0), 0.0)
    assert lcf.counters["b"] == 0


def test_artifact_leaves_the_first_token_uncharged_and_charges_finish_events():
    vtc = make_scheduler("vtc", artifact=True)
    finished(vtc, "a", 10, 10)
    assert vtc.counters["a"] == W_P * 10 + W_Q * 9 + W_Q  # no first token; +1 at finish


def test_finish_events_charge_the_whole_batch_once_per_step():
    """The artifact's finish charge through the real engine: two requests finish in one step,
    a third runs on (and each request's first token is free)."""
    vtc = ArtifactVTC()
    arrivals = [Arrival(0.0, "a", 5, 4), Arrival(0.0, "b", 5, 4), Arrival(0.0, "c", 5, 8)]
    engine, _, _ = drive(vtc, arrivals, kv_tokens=100)
    # Finish events at step 4 (a and b together: one event) and step 8 (c): a and b get one
    # extra w_q, c two.
    assert vtc.counters["a"] == W_P * 5 + W_Q * 3 + W_Q
    assert vtc.counters["c"] == W_P * 5 + W_Q * 7 + 2 * W_Q
