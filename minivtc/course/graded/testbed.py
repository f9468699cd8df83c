"""A server reduced to what a scheduling policy sees: the bench a4's and a6's tests run on.

Owns `serve` (replay arrivals through a policy: each step an admission round, one token for
every running request, its charge, the finished requests' release) and `Bench`, the loop it
drives. It is not the engine: no blocks, no runner, none of `Engine`'s parts, so a4 and a6 are
tested the same way on the reference and on a student edition whose other assignments are
not done yet (`minivtc course test a4`), and it gives nothing of a3 (`Engine.step`) away.
What it keeps is what the policy's fairness depends on, as the engine does it with a unit
runner and blocks of one token (`driver.drive`; tests/test_course.py checks that the two
give the same service, step by step):

- a request reserves prompt + max_tokens tokens of the pool at admission (a3's full
  reservation) and frees them when it finishes; the batch holds at most `max_running`;
- the admission round is Algorithm 2's: peek, and dispatch while the peeked request fits;
  the first that does not fit ends the round (no skipping);
- a step takes one time unit; every running request gets one token, the policy is charged
  for the step's tokens at once (`on_decode`), and a request with all its tokens finishes
  (`on_finish`), or earlier, at end-of-sequence, after `Arrival.stop` tokens (finish_reason
  "eos", as the engine ends it: its status and finish_reason both); service is w_p per prompt
  token at admission and w_q per output token (`prices`: other w_p and w_q);
- with `fairness`, the package's own check (`FairnessCheck`, Lemma 4.3 for the VTC family)
  runs after every step and whenever a client joins, as the engine's check_fairness does.

Plain Python: no tensors, no model.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable

from minivtc.course.graded.driver import W_P, W_Q, Arrival, Step
from minivtc.fairness.fairness_check import FairnessCheck
from minivtc.fairness.scheduler import Scheduler, admission_round
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request, Status

__all__ = ["clients_of", "idle_then_return", "on_a10g", "serve", "throughput", "worst_gap"]
__all__ += ["worst_shortfall"]

MAX_RUNNING = 256  # the engine's default batch limit (EngineConfig.max_running)


class Bench:
    """A pool of `kv_tokens` tokens in front of `scheduler`; `step` is one time unit."""

    def __init__(
        self,
        scheduler: Scheduler,
        kv_tokens: int,
        fairness: bool = False,
        step_s: Callable[[list[Request]], float] | None = None,
        max_running: int = MAX_RUNNING,
    ) -> None:
        self.scheduler, self.pool, self.free = scheduler, kv_tokens, kv_tokens
        self.step_s, self.max_running = step_s, max_running
        self.clock = 0.0
        self.running: list[Request] = []
        self.waiting_ids: set[str] = set()
        self.queued: dict[str, int] = {}  # client -> its requests waiting (its backlog)
        self.tokens: dict[str, list[int]] = {}  # client -> [prompt tokens, output tokens]
        self.check = (
            FairnessCheck(scheduler, kv_tokens - 1, kv_tokens, kv_tokens, "full", None)
            if fairness
            else None
        )
        self.requests: list[Request] = []  # every request queued, in arrival order
        self.stops: dict[str, int] = {}  # request id -> the output tokens it ends after
        self.unoffered = 0  # admission rounds in which peek gave None while requests waited

    def add(self, a: Arrival) -> Request | str:
        """Queue `a`'s request; or why it is refused (it can never fit; the policy refused)."""
        if a.prompt + a.output > self.pool:
            return f"prompt + max_tokens = {a.prompt + a.output} never fits {self.pool} tokens"
        params = SamplingParams(max_tokens=a.output, ignore_eos=a.stop is None)
        request = Request(f"req-{len(self.requests)}", a.client, [5] * a.prompt, params, self.clock)
        self.stops[request.request_id] = min(a.output, a.stop or a.output)
        reason = self.scheduler.add(request, self.clock)
        if reason is not None:
            return reason
        self.waiting_ids.add(request.request_id)
        self.queued[a.client] = self.queued.get(a.client, 0) + 1
        self.requests.append(request)
        if self.check is not None:
            self.check.check_spread()  # its client may have joined the queue, lifted
        return request

    def backlogged(self) -> set[str]:
        """The clients with a request waiting (counted by the bench, not asked of the policy)."""
        return {c for c, n in self.queued.items() if n}

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting_ids)

    def step(self) -> list[Request]:
        """Admit while the peeked request fits; one token each; charge; release the finished."""
        stopped = admission_round(
            self.scheduler, self.admit, self.check.dispatched if self.check else None
        )
        self.unoffered += stopped is None and bool(self.waiting_ids)
        if not self.running:
            return []  # nothing to serve: the time does not move
        batch = list(self.running)
        self.clock += 1.0 if self.step_s is None else self.step_s(batch)
        for r in batch:
            r.num_computed = len(r.prompt_ids) + len(r.output_ids)
            r.output_ids.append(7)
            self.tokens[r.client_id][1] += 1
        if self.check is None:
            self.scheduler.on_decode(batch)
        else:
            with self.check.step(batch):
                self.scheduler.on_decode(batch)
        for r in batch:
            if len(r.output_ids) == self.stops[r.request_id]:
                self.finish(r, "length" if len(r.output_ids) == r.params.limit else "eos")
        self.scheduler.check_invariants()
        if self.check is not None:
            self.check.check()
        return batch

    def admit(self, r: Request) -> bool:
        """Reserve prompt + max_tokens and run `r`, if the batch and the pool have room."""
        if len(self.running) >= self.max_running or r.max_num_tokens > self.free:
            return False
        self.free -= r.max_num_tokens
        r.status, r.admitted_time = Status.RUNNING, self.clock
        self.running.append(r)
        self.waiting_ids.discard(r.request_id)
        self.queued[r.client_id] -= 1
        self.tokens.setdefault(r.client_id, [0, 0])[0] += r.num_prompt
        return True

    def finish(self, request: Request, reason: str) -> None:
        request.end(Status.FINISHED, reason, self.clock)
        self.running.remove(request)
        self.free += request.max_num_tokens
        self.scheduler.on_finish(request)


def serve(
    scheduler: Scheduler,
    arrivals: list[Arrival],
    kv_tokens: int,
    fairness: bool = False,
    prices: tuple[float, float] = (W_P, W_Q),
    **how,
) -> tuple[Bench, list[Step], list[tuple[Arrival, str]]]:
    """Replay `arrivals` on a `Bench` (`how`: its step_s and max_running): the bench, what each
    step served whom (priced at `prices`, w_p and w_q) and who was backlogged throughout it (as
    `driver.drive` returns them), and the refused arrivals."""
    w_p, w_q = prices
    bench = Bench(scheduler, kv_tokens, fairness, **how)
    pending = deque(sorted(arrivals, key=lambda a: a.time))
    steps: list[Step] = []
    rejected: list[tuple[Arrival, str]] = []
    while pending or bench.has_unfinished():
        while pending and pending[0].time <= bench.clock:
            a = pending.popleft()
            if isinstance(added := bench.add(a), str):
                rejected.append((a, added))
        if not bench.has_unfinished():
            if not pending:
                break
            bench.clock = pending[0].time
            continue
        before = bench.backlogged(), {c: tuple(t) for c, t in bench.tokens.items()}
        try:
            ran = bench.step()
        except AssertionError as e:  # where it first broke, for the student to replay
            at = f"first broken at step {len(steps) + 1}, time {bench.clock:g}"
            raise AssertionError(f"{str(e).splitlines()[0]} ({at})") from e
        if not ran:  # nothing ran: the pool is empty, so every waiting request fits
            raise AssertionError(
                f"not work-conserving: the server is idle, {len(bench.waiting_ids)} request(s) "
                "wait and each fits the empty pool, but peek() offers none"
            )
        service = {
            c: w_p * (t[0] - before[1].get(c, (0, 0))[0])
            + w_q * (t[1] - before[1].get(c, (0, 0))[1])
            for c, t in bench.tokens.items()
        }
        steps.append(Step(before[0] & bench.backlogged(), service))
    assert bench.free == bench.pool, "the bench lost pool tokens"
    return bench, steps, rejected


def idle_then_return(policy: Scheduler) -> tuple[Bench, list[Step], list[tuple[Arrival, str]]]:
    """A floods throughout; B is busy early, idle for a long stretch, then floods again."""
    # Capacity is about 0.5 requests per time unit (64 tokens / 16 per request, 8 steps each):
    # one request per unit from each active client keeps both backlogged.
    a = [Arrival(float(t), "A", 8, 8) for t in range(0, 600)]
    b = [Arrival(float(t), "B", 8, 8) for t in list(range(0, 20)) + list(range(300, 600))]
    return serve(policy, a + b, kv_tokens=64)


def on_a10g(policy: Scheduler, name: str) -> tuple[Bench, list[Step]]:
    """The paper's workload `name` (Section 5.2) served by the bench with the simulator's step
    times (A10G, Llama-2-7b; `sim/step_time.py`), a pool of 10,000 tokens, no batch limit."""
    from minivtc.sim.step_time import StepShape, step_time_model
    from minivtc.sim.workloads import workload

    model = step_time_model("a10g-llama7b")
    trace = workload(name).make()
    arrivals = [Arrival(t.arrival_s, t.client, t.input_tokens, t.output_tokens) for t in trace]

    def step_s(batch: list[Request]) -> float:
        return model.step_time(StepShape.of(batch))

    bench, steps, _ = serve(policy, arrivals, 10_000, step_s=step_s, max_running=1 << 30)
    return bench, steps


def worst_gap(steps: list[Step], clients: list[str]) -> tuple[float, str, str]:
    """The largest `driver.max_gap` of any pair of `clients`, and between whom: the same
    sums, over arrays (the real trace has 27 clients, 351 pairs and 23,000 steps)."""
    import numpy as np

    column = {c: i for i, c in enumerate(clients)}
    service = np.zeros((len(steps) + 1, len(clients)))  # row 0: before the first step
    backlogged = np.zeros((len(steps) + 1, len(clients)), dtype=bool)
    for t, s in enumerate(steps, start=1):
        for c, v in s.service.items():
            if c in column:
                service[t, column[c]] = v
        for c in s.backlogged:
            if c in column:
                backlogged[t, column[c]] = True
    best = (0.0, "", "")
    for f, g in itertools.combinations(clients, 2):
        both = backlogged[:, column[f]] & backlogged[:, column[g]]
        if not both.any():
            continue
        prefix = np.cumsum(np.where(both, service[:, column[f]] - service[:, column[g]], 0.0))
        starts = np.flatnonzero(~both)  # each interval starts over after a step not both
        last = np.maximum.accumulate(np.where(~both, np.arange(len(both)), 0))
        relative = prefix - prefix[last]  # the difference since the interval began
        widths = np.maximum.reduceat(relative, starts) - np.minimum.reduceat(relative, starts)
        best = max(best, (float(widths.max()), f, g))
    return best


def worst_shortfall(steps: list[Step], clients: list[str]) -> tuple[float, str, str]:
    """What Theorem 4.9 bounds: the most by which a client g was served more than a client f
    over an interval in which f was backlogged throughout (g need not be), and who (f, g)."""
    best = (0.0, "", "")
    for f, g in itertools.permutations(clients, 2):
        lead = lowest = 0.0  # g's lead over f since f's stretch began, and its least since
        for s in steps:
            if f not in s.backlogged:
                lead = lowest = 0.0
                continue
            lead += s.service.get(g, 0.0) - s.service.get(f, 0.0)
            lowest = min(lowest, lead)
            best = max(best, (lead - lowest, f, g))
    return best


def clients_of(bench: Bench) -> list[str]:
    return sorted({r.client_id for r in bench.requests})


def throughput(bench: Bench) -> float:
    """Tokens (prompt and output, unweighted) per second, first arrival to last completion."""
    ends = [r.finish_time for r in bench.requests if r.finish_time is not None]
    tokens = sum(r.num_prompt + len(r.output_ids) for r in bench.requests if r.finish_time)
    return tokens / (max(ends) - min(r.arrival_time for r in bench.requests))
