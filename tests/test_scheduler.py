"""The scheduler interface, FCFS and RPM, and the paper's theorems on random workloads through
the real engine loop, for every policy they concern.

No model: a `UnitRunner` stands in for the forward pass (every step takes one time unit and
yields one token per running request), so these tests drive the same `Engine.step()`,
admission and KV accounting that serve real tokens. Service W is measured from the tokens the
engine processed (`engine.client_tokens`), independently of the scheduler's counters.
VTC's own mechanics are `test_vtc.py`'s, the predictors `test_predictors.py`'s, the names
`test_policies.py`'s and the cost h `test_cost.py`'s.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivtc.core.engine import Engine, RequestRejected
from minivtc.core.kv_pool import BlockAllocator
from minivtc.core.policies import make_scheduler
from minivtc.core.sampler import SamplingParams
from minivtc.core.scheduler import FCFS, RPM
from minivtc.core.vtc import VTC

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


def test_check_fairness_needs_a_vtc_family_scheduler():
    with pytest.raises(ValueError, match="check_fairness needs a VTC-family scheduler"):
        drive(FCFS(), [Arrival(0, "a", 1, 1)], 10, fairness=True)
