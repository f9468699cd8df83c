"""The harness the theorem tests drive: the real engine, with a stand-in for the model.

Owns `drive` (replay arrivals through `Engine.step()` with a `UnitRunner`: every step takes one
time unit and yields one token per running request), the service each step gave each client
(measured from the tokens the engine processed, independently of any scheduler's counters),
`max_gap` (the largest service difference over an interval in which two clients were both
backlogged: what Theorem 4.4 bounds) and random workloads. Used by the graded tests of the
scheduling assignments and by the package's own tests.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import deque
from dataclasses import dataclass, field

from hypothesis import strategies as st

from minivtc.engine.engine import Engine, RequestRejected
from minivtc.engine.engine_config import EngineConfig
from minivtc.engine.kv_pool import BlockAllocator
from minivtc.fairness.cost import W_P, W_Q
from minivtc.fairness.scheduler import admission_round as admission_round  # the graded tests'
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request
from minivtc.sim.backlog import watch_rejoining

__all__ = ["Arrival", "Engine", "Step", "UnitRunner", "W_P", "W_Q", "admission_round", "bound_u"]
__all__ += ["construction", "draw_workload", "drive", "first_over", "idle_then_return", "max_gap"]
__all__ += ["random_arrivals", "service_difference", "watch_joins", "workloads"]


@dataclass(frozen=True)
class Arrival:
    time: float
    client: str
    prompt: int
    output: int  # max_tokens
    stop: int | None = None  # the request stops at end-of-sequence after this many (testbed)


@dataclass
class Step:
    backlogged: set[str]  # clients with a request waiting throughout this step
    service: dict[str, float]  # weighted tokens processed for each client in this step
    now: float = 0.0  # the clock when the step ended
    counters: dict[str, float] = field(default_factory=dict)  # the scheduler's, after the step
    admitted: list[str] = field(default_factory=list)  # the client of each request admitted


class UnitRunner:
    """A runner whose every step takes one second and makes token 7 (it never swaps)."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock

    def run(self, requests: list[Request], allocator: BlockAllocator) -> list[int]:
        self.clock[0] += 1.0
        return [7] * len(requests)

    def release(self, request: Request) -> None:
        pass

    def swap_out(self, request: Request, allocator: BlockAllocator) -> None:
        raise AssertionError("the unit runner never swaps")

    def swap_in(self, request: Request, allocator: BlockAllocator, start: int) -> None:
        raise AssertionError("the unit runner never swaps")


def drive(
    scheduler, arrivals, kv_tokens, fairness=False, max_positions=10**6, allocator=None, **options
):
    """`options`: the engine's memory options (reservation, victim, preempt_gap). `allocator`:
    the engine's pool (default: `kv_tokens` tokens in blocks of 1), for a policy that is handed
    it to look at (Lesson 5's skipping variant)."""
    clock = [0.0]
    engine = Engine(
        UnitRunner(clock),
        allocator if allocator is not None else BlockAllocator(kv_tokens, 1),
        scheduler,
        max_positions,
        eos_id=-1,
        clock=lambda: clock[0],
        config=EngineConfig(check_invariants=True, check_fairness=fairness, **options),
    )
    pending = deque(sorted(arrivals, key=lambda a: a.time))
    steps, rejected = [], []
    rejoined = watch_rejoining(engine)
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
        running = {r.request_id for r in engine.running}
        rejoined.clear()
        engine.step()
        after = snapshot(engine)
        service = {
            c: W_P * (after[c][0] - before[1].get(c, (0, 0))[0])
            + W_Q * (after[c][1] - before[1].get(c, (0, 0))[1])
            for c in after
        }
        backlogged = before[0] & waiting_clients(scheduler) - rejoined
        admitted = [r.client_id for r in engine.running if r.request_id not in running]
        counters = dict(getattr(scheduler, "counters", {}))
        steps.append(Step(backlogged, service, clock[0], counters, admitted))
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks, (
        f"every request finished but {engine.allocator.num_used_blocks} blocks are still held"
    )
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


def service_difference(steps: list[Step], f: str, g: str) -> tuple[list[float], list[float]]:
    """W_f - W_g after each step since the start, and the same with NaN (not drawn) where f and
    g were not both backlogged: `max_gap` is the largest rise or fall within one stretch."""
    total = list(itertools.accumulate(s.service.get(f, 0.0) - s.service.get(g, 0.0) for s in steps))
    both = [d if {f, g} <= s.backlogged else math.nan for d, s in zip(total, steps, strict=True)]
    return total, both


def construction(num_long: int, num_each: int, m: int) -> list[Arrival]:
    """F starts `num_long` requests of 1 + (m - 1) tokens; half a step later F and G send
    `num_each` more each. (1, 3): Theorem 4.8's construction in a pool of m tokens; (32, 20):
    the latest victim's counterexample (Lesson 11)."""
    first = [Arrival(0.0, "F", 1, m - 1)] * num_long
    return first + [Arrival(0.5, c, 1, m - 1) for c in "FG" for _ in range(num_each)]


def first_over(steps: list[Step], f: str, g: str, limit: float, weights=None) -> int | None:
    """The first step (counted from 1) at which `max_gap` of f and g passes `limit`."""
    wf, wg = (weights or {}).get(f, 1.0), (weights or {}).get(g, 1.0)
    lo, hi, prefix = 0.0, 0.0, 0.0
    for i, s in enumerate(steps, start=1):
        if f in s.backlogged and g in s.backlogged:
            prefix += s.service.get(f, 0.0) / wf - s.service.get(g, 0.0) / wg
            lo, hi = min(lo, prefix), max(hi, prefix)
            if hi - lo > limit:
                return i
        else:
            lo = hi = prefix = 0.0
    return None


def bound_u(max_input: int, kv_tokens: int) -> float:
    return max(W_P * max_input, W_Q * kv_tokens)


workloads = st.fixed_dictionaries(
    {
        "n_clients": st.integers(2, 5),
        "n_requests": st.integers(5, 60),
        "kv_tokens": st.integers(40, 160),
        "seed": st.integers(0, 10**6),
        "bursty": st.booleans(),
    }
)


def watch_joins(policy) -> dict[str, dict[str, float]]:
    """client -> every counter right after that client first joined the queue (wraps
    `policy.join`): where its lift put it, beside the others (Lesson 11's join floor)."""
    joined: dict[str, dict[str, float]] = {}
    join = policy.join

    def recorded(request: Request) -> None:
        join(request)
        joined.setdefault(request.client_id, dict(policy.counters))

    policy.join = recorded
    return joined


def draw_workload(rng: random.Random) -> dict:
    """A workload as `workloads` draws one (hypothesis), drawn from `rng` instead: for a
    lesson's loop of random runs."""
    return {
        "n_clients": rng.randint(2, 5),
        "n_requests": rng.randint(5, 60),
        "kv_tokens": rng.randint(40, 160),
        "seed": rng.randrange(10**6),
        "bursty": rng.random() < 0.5,
    }


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


def idle_then_return(policy):
    """A floods throughout; B is busy early, idle for a long stretch, then floods again."""
    # Capacity is about 0.5 requests per time unit (64 tokens / 16 per request, 8 steps each):
    # one request per unit from each active client keeps both backlogged.
    a = [Arrival(float(t), "A", 8, 8) for t in range(0, 600)]
    b = [Arrival(float(t), "B", 8, 8) for t in list(range(0, 20)) + list(range(300, 600))]
    return drive(policy, a + b, kv_tokens=64)
