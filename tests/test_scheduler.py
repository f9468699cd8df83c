"""The policies, checked by the paper's theorems on random workloads through the real engine loop.

No model: a `UnitRunner` stands in for the forward pass (every step takes one time unit and
yields one token per running request), so these tests drive the same `Engine.step()`,
admission and KV accounting that serve real tokens. Service W is measured from the tokens the
engine processed (`engine.client_tokens`), independently of the scheduler's counters.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivtc.core.cost import LinearCost, ProfiledCost
from minivtc.core.engine import Engine, RequestRejected
from minivtc.core.kv_pool import BlockAllocator
from minivtc.core.policies import make_scheduler
from minivtc.core.predictors import MeanOfLast, MovingAverage, Oracle
from minivtc.core.request import Request
from minivtc.core.sampler import SamplingParams
from minivtc.core.scheduler import FCFS, RPM
from minivtc.core.vtc import VTC, ArtifactVTC

W_P, W_Q = 1.0, 2.0


@dataclass(frozen=True)
class Arrival:
    time: float
    client: str
    prompt: int
    output: int


@dataclass
class Step:
    backlogged: set[str]  # clients with waiting requests before *and* after this step's admission
    service: dict[str, float]  # weighted tokens processed for each client in this step


class UnitRunner:
    def __init__(self, clock: list[float]) -> None:
        self.clock = clock

    def run(self, requests, allocator):
        self.clock[0] += 1.0
        return [7] * len(requests)

    def release(self, request):
        pass


def drive(scheduler, arrivals, kv_tokens, fairness=False, max_positions=10**6):
    clock = [0.0]
    engine = Engine(UnitRunner(clock), BlockAllocator(kv_tokens, 1), scheduler, max_positions,
                    eos_id=-1, clock=lambda: clock[0], check_invariants=True,
                    check_fairness=fairness)  # fmt: skip
    pending = deque(sorted(arrivals, key=lambda a: a.time))
    steps, rejected = [], []
    while pending or engine.has_unfinished():
        while pending and pending[0].time <= clock[0]:
            a = pending.popleft()
            params = SamplingParams(max_tokens=a.output, ignore_eos=True)
            try:
                engine.add_request([5] * a.prompt, params, client_id=a.client)
            except RequestRejected as e:
                rejected.append((a, e))
        if not engine.has_unfinished():
            if not pending:
                break
            clock[0] = pending[0].time
            continue
        before = waiting_clients(scheduler), snapshot(engine)
        engine.step()
        after = snapshot(engine)
        service = {c: W_P * (after[c][0] - before[1].get(c, (0, 0))[0])
                   + W_Q * (after[c][1] - before[1].get(c, (0, 0))[1]) for c in after}  # fmt: skip
        steps.append(Step(before[0] & waiting_clients(scheduler), service))
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks
    return engine, steps, rejected


def waiting_clients(scheduler) -> set[str]:
    return {r.client_id for r in scheduler.waiting()}


def snapshot(engine) -> dict[str, tuple[int, int]]:
    return {c: (t.num_input, t.num_output) for c, t in engine.client_tokens.items()}


def max_gap(steps: list[Step], f: str, g: str, weights=None) -> float:
    """max |W_f - W_g| over every interval in which f and g were both backlogged throughout."""
    wf, wg = (weights or {}).get(f, 1.0), (weights or {}).get(g, 1.0)
    best, lo, hi, prefix = 0.0, 0.0, 0.0, 0.0
    for s in steps:
        if f in s.backlogged and g in s.backlogged:
            prefix += s.service.get(f, 0.0) / wf - s.service.get(g, 0.0) / wg
            lo, hi = min(lo, prefix), max(hi, prefix)
            best = max(best, hi - lo)
        else:
            lo = hi = prefix = 0.0
    return best


def bound_u(max_input: int, kv_tokens: int) -> float:
    return max(W_P * max_input, W_Q * kv_tokens)


workloads = st.fixed_dictionaries({
    "n_clients": st.integers(2, 5),
    "n_requests": st.integers(5, 60),
    "kv_tokens": st.integers(40, 160),
    "seed": st.integers(0, 10**6),
    "bursty": st.booleans(),
})  # fmt: skip


def random_arrivals(w):
    """Requests that each fit in the pool (L_input <= 30), arriving Poisson or in bursts."""
    rng = random.Random(w["seed"])
    max_len = min(30, w["kv_tokens"] // 2)
    clients = [f"c{i}" for i in range(w["n_clients"])]
    out, t = [], 0.0
    for _ in range(w["n_requests"]):
        t += rng.expovariate(0.3) if not w["bursty"] else rng.choice([0.0, 0.0, 0.0, 25.0])
        prompt, output = rng.randint(1, max_len), rng.randint(1, max_len)
        out.append(Arrival(round(t, 2), rng.choice(clients), prompt, output))
    return out


@settings(max_examples=60, deadline=None)
@given(workloads)
def test_lemma_4_3_and_theorems_4_4_and_4_9(w):
    """Lemma 4.3 after every step (the engine asserts it); Thm 4.4 and 4.9 on every interval."""
    arrivals = random_arrivals(w)
    u = bound_u(max(a.prompt for a in arrivals), w["kv_tokens"])
    engine, steps, _ = drive(VTC(), arrivals, w["kv_tokens"], fairness=True)
    clients = sorted({a.client for a in arrivals})
    for f in clients:
        for g in clients:
            if f < g:
                assert max_gap(steps, f, g) <= 2 * u, (f, g)  # Theorem 4.4
            # Theorem 4.9: f backlogged throughout => W_f >= W_g - 4U, for any g.
            worst, prefix, lo = 0.0, 0.0, 0.0
            for s in steps:
                if f in s.backlogged:
                    prefix += s.service.get(g, 0.0) - s.service.get(f, 0.0)
                    worst, lo = max(worst, prefix - lo), min(lo, prefix)
                else:
                    prefix = lo = 0.0
            assert worst <= 4 * u, (f, g)


@settings(max_examples=30, deadline=None)
@given(workloads)
def test_weighted_vtc_follows_weights_within_the_bound(w):
    arrivals = random_arrivals(w)
    weights = {f"c{i}": float(i + 1) for i in range(w["n_clients"])}
    u = bound_u(max(a.prompt for a in arrivals), w["kv_tokens"])  # weights >= 1: U/min_w <= U
    engine, steps, _ = drive(VTC(weights=weights), arrivals, w["kv_tokens"], fairness=True)
    for f in weights:
        for g in weights:
            if f < g:
                assert max_gap(steps, f, g, weights) <= 2 * u


def test_weighted_vtc_shares_are_proportional_when_all_are_backlogged():
    weights = {"a": 1.0, "b": 2.0, "c": 4.0}
    arrivals = [Arrival(0.0, c, 10, 10) for c in weights for _ in range(150)]
    _, steps, _ = drive(VTC(weights=weights), arrivals, kv_tokens=100)
    busy = [s for s in steps if s.backlogged == set(weights)]
    total = {c: sum(s.service.get(c, 0.0) for s in busy) for c in weights}
    assert total["b"] / total["a"] == pytest.approx(2.0, rel=0.1)
    assert total["c"] / total["a"] == pytest.approx(4.0, rel=0.1)


def test_theorem_4_8_the_bound_is_tight_within_2x():
    """F floods first and fills the pool; G arrives a moment later and cannot preempt. Any
    work-conserving, non-preemptive policy (VTC and FCFS alike) shows a gap ~ w_q * M."""
    m = 100
    arrivals = [Arrival(0.0, "F", 1, m - 1)] + [
        Arrival(0.5, c, 1, m - 1) for c in "FG" for _ in range(3)
    ]
    u = bound_u(1, m)
    for policy in (VTC(), FCFS()):
        _, steps, _ = drive(policy, arrivals, kv_tokens=m)
        gap = max_gap(steps, "F", "G")
        assert W_Q * (m - 2) <= gap, policy.name
        if isinstance(policy, VTC):
            assert gap <= 2 * u  # so VTC's 2U is within 2x of what any such policy must allow


def idle_then_return(policy):
    """A floods throughout; B is busy early, idle for a long stretch, then floods again."""
    # Capacity is about 0.5 requests per time unit (64 tokens / 16 per request, 8 steps each):
    # one request per unit from each active client keeps both backlogged.
    a = [Arrival(float(t), "A", 8, 8) for t in range(0, 600)]
    b = [Arrival(float(t), "B", 8, 8) for t in list(range(0, 20)) + list(range(300, 600))]
    return drive(policy, a + b, kv_tokens=64)


def test_lcf_lets_a_returning_client_monopolise_and_vtc_does_not():
    u = bound_u(8, 64)
    _, lcf_steps, _ = idle_then_return(make_scheduler("lcf"))
    _, vtc_steps, _ = idle_then_return(make_scheduler("vtc"))
    assert max_gap(lcf_steps, "A", "B") > 5 * u  # B's stale low counter takes every dispatch
    assert max_gap(vtc_steps, "A", "B") <= 2 * u


def test_fcfs_gap_grows_without_bound():
    def gap(horizon):
        arrivals = [Arrival(t / 2, "A", 8, 8) for t in range(2 * horizon)]  # A sends 2x B's rate
        arrivals += [Arrival(float(t), "B", 8, 8) for t in range(horizon)]
        _, steps, _ = drive(FCFS(), arrivals, kv_tokens=64)
        return max_gap(steps, "A", "B")

    short, long = gap(200), gap(400)
    u = bound_u(8, 64)
    assert long > 1.6 * short and long > 4 * u


def test_rpm_counts_exactly_at_the_window_edges():
    arrivals = [Arrival(t, "a", 2, 2) for t in (0.0, 10.0, 59.9, 60.0, 69.9, 70.0)]
    arrivals += [Arrival(0.0, "b", 2, 2)]  # another client has its own window
    engine, _, rejected = drive(RPM(2), arrivals, kv_tokens=50)
    assert [a.time for a, _ in rejected] == [59.9, 69.9]  # 0.0 leaves the window at 60.0 exactly
    for _, e in rejected:
        assert (
            e.kind == "rate_limited" and "rate limit: client 'a' already has 2 requests" in e.reason
        )
    assert engine.client_tokens["a"].num_output == 4 * 2  # rejected requests never ran


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


def test_predictors():
    mean, ema = MeanOfLast(window=5), MovingAverage()
    lengths = [10, 20, 30, 40, 50, 60]
    for i, n in enumerate(lengths):
        r = Request(f"r{i}", "a", [1], SamplingParams(max_tokens=n), 0.0)
        r.output_ids = [1] * n
        mean.observe(r), ema.observe(r)
    probe = Request("p", "a", [1], SamplingParams(), 0.0)
    assert mean.predict(probe) == sum(lengths[-5:]) / 5  # the paper: mean of the last 5
    expect = 10.0
    for n in lengths[1:]:
        expect = (4 * expect + n) / 5
    assert ema.predict(probe) == pytest.approx(expect)  # the artifact's moving average
    spread = Oracle(0.5, seed=3)
    draws = [
        spread.predict(Request("q", "a", [1], SamplingParams(max_tokens=100), 0.0))
        for _ in range(200)
    ]
    assert 50 <= min(draws) and max(draws) <= 150 and max(draws) - min(draws) > 80


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


def test_make_scheduler_names():
    names = ["fcfs", "rpm:5", "lcf", "vtc", "vtc-artifact", "vtc-predict", "vtc-predict-ema",
             "vtc-oracle", "vtc-oracle:0.5", "vtc-profile", "vtc-oracle-profile",
             "lcf-profile"]  # fmt: skip
    for name in names:
        assert make_scheduler(name).name == name
    with pytest.raises(ValueError, match="unknown scheduler 'vtc2'; choose one of"):
        make_scheduler("vtc2")
    with pytest.raises(ValueError, match="check_fairness needs a VTC-family scheduler"):
        drive(FCFS(), [Arrival(0, "a", 1, 1)], 10, fairness=True)


def test_profile_suffix_charges_the_profiled_cost():
    vtc = make_scheduler("vtc-predict-profile")
    assert isinstance(vtc.cost, ProfiledCost) and isinstance(vtc.predictor, MeanOfLast)
    finished(vtc, "a", 100, 50)
    assert vtc.counters["a"] == pytest.approx(ProfiledCost()(100, 50))
