"""Theorem 4.4's quantity, measured on a run: the largest service gap between two clients over
an interval in which both were backlogged, on one engine or over a fleet.

Owns `PairGaps`, the tracker, and `BacklogWatch`, which steps an engine and keeps, for every pair of
clients backlogged together, the running difference of their service since the pair's interval
began; the worst |W_f(t1, t2) - W_g(t1, t2)| over all such intervals is what Theorem 4.4 bounds by
2U (and fair preemption by 2 U_P, `cost.preemptive_bound`). Service is measured from the tokens the
engine processed (w_p per prompt token, w_c per prompt token found in the prefix cache, w_q per
output token, divided by the client's weight), independently of any scheduler's counters.

Backlogged is Definition 4.1's: a request in the waiting queue at every instant of the step. A
client waiting before and after a step may still have left the queue inside it: its only waiting
request admitted, then preempted back. `BacklogWatch` sees that through the engine's `on_preempt`
observers and does not count the client as backlogged in that step. Used by `simulate(...,
watch_backlog=True)`, the fair-memory experiment and the course's graded harness. Plain Python.

`FleetWatch` is the same tracker over a fleet (`fleet/replicas.py`), where backlogged means a
request waiting somewhere: at the dispatcher, or in any replica's queue. It is told, event by
event (an arrival, a dispatch round, a replica's step), which clients were waiting before it and
what service each received in it, measured by the linear price of the tokens processed (w_p per
prompt token, w_q per output token, divided by the client's weight: no prefix cache in a fleet,
so no w_c), independently of any counter. A pair's interval starts over when one of them is not
backlogged throughout an event. minivtc/fleet/README.md; Lesson 14.
"""

from __future__ import annotations

import itertools
from collections import Counter

from minivtc.fairness.cost import W_P, W_Q, LinearCost, linear_price
from minivtc.requests.request import Request

__all__ = ["BacklogWatch", "FleetWatch", "PairGaps", "watch_rejoining"]


class PairGaps:
    """For every pair of clients backlogged together, the running difference of their service
    since the pair's interval began, and the worst |W_f(t1, t2) - W_g(t1, t2)| so far: the
    tracker `BacklogWatch` (one engine) and `FleetWatch` (a fleet) both keep."""

    def __init__(self) -> None:
        self.running_diff: dict[tuple[str, str], tuple[float, float, float]] = {}
        self.backlogged: list[str] = []  # at the last update, sorted: the pairs' clients
        self.worst = 0.0  # the largest gap so far
        self.pair: tuple[str, str] | None = None  # and between whom

    def update(self, backlogged: list[str], service: dict[str, float]) -> None:
        """One step or event: `backlogged` (sorted), the clients backlogged throughout it;
        `service`, what each received in it. Extend each pair's interval; a pair not both
        backlogged starts over."""
        if backlogged != self.backlogged:
            old, self.backlogged = self.running_diff, backlogged
            self.running_diff = {
                pair: old.get(pair, (0.0, 0.0, 0.0))
                for pair in itertools.combinations(backlogged, 2)
            }
        # PERF: the pairs' table is updated in place, and a pair whose difference did not
        # move is left alone (a fleet's event serves few of its clients)
        diffs = self.running_diff
        for pair, (prefix, lo, hi) in diffs.items():
            moved = service.get(pair[0], 0.0) - service.get(pair[1], 0.0)
            if not moved:
                continue
            prefix += moved
            if prefix < lo:
                lo = prefix
            elif prefix > hi:
                hi = prefix
            diffs[pair] = (prefix, lo, hi)
            if hi - lo > self.worst:
                self.worst, self.pair = hi - lo, pair


class BacklogWatch(PairGaps):
    """Wraps `engine`: call `step()` instead of `engine.step()`; read `worst` and `pair`."""

    def __init__(
        self, engine, w_p: float = W_P, w_q: float = W_Q, w_c: float | None = None
    ) -> None:
        super().__init__()
        self.engine, self.cost, self.w_c = engine, LinearCost(w_p, w_q), w_c
        self.rejoined = watch_rejoining(engine)

    def step(self) -> list[Request]:
        before = self.waiting()
        tokens = self.tokens(before)
        self.rejoined.clear()
        ran = self.engine.step()
        backlogged = sorted(before & self.waiting() - self.rejoined)
        after = self.tokens(backlogged)
        weights = self.engine.scheduler.ledger.client_weights()
        service = {
            c: self.price(*(a - b for a, b in zip(after[c], tokens[c], strict=True)))
            / weights.get(c, 1.0)
            for c in backlogged
        }
        self.update(backlogged, service)
        return ran

    def price(self, num_input: int, num_output: int, num_cached: int) -> float:
        return linear_price(num_input, num_output, num_cached, self.cost, self.w_c)

    def waiting(self) -> set[str]:
        return {r.client_id for r in self.engine.scheduler.waiting()}

    def tokens(self, clients) -> dict[str, tuple[int, int, int]]:
        counts = self.engine.client_tokens
        return {
            c: (counts[c].num_input, counts[c].num_output, counts[c].num_cached)
            if c in counts
            else (0, 0, 0)
            for c in clients
        }


class FleetWatch(PairGaps):
    """`PairGaps` over a fleet, told of each event (`joined`, `left`, `event`); read `worst`
    and `pair`."""

    def __init__(self, weights: dict[str, float] | None = None) -> None:
        super().__init__()
        self.weights = dict(weights or {})
        self.num_waiting: Counter[str] = Counter()  # client -> its requests waiting in the fleet
        self.waiting_now: set[str] = set()  # the clients with a request waiting

    def joined(self, client: str) -> None:
        """A request of `client` waits in the fleet (at the dispatcher or a replica's queue)."""
        self.num_waiting[client] += 1
        self.waiting_now.add(client)

    def left(self, client: str) -> None:
        """A request of `client` stopped waiting (bound to a replica, or admitted by one)."""
        self.num_waiting[client] -= 1
        if not self.num_waiting[client]:
            self.waiting_now.discard(client)

    def waiting(self) -> frozenset[str]:
        return frozenset(self.waiting_now)

    def price(self, num_prompt: int, num_output: int, client: str) -> float:
        """The linear price, as `BacklogWatch`'s (no prefix cache in a fleet: no w_c)."""
        return linear_price(num_prompt, num_output) / self.weights.get(client, 1.0)

    def event(self, before: frozenset[str], service: dict[str, float]) -> None:
        """One event ended: `before`, the clients waiting when it began; `service`, what each
        received in it (none: an arrival)."""
        self.update(sorted(before & self.waiting()), service)


def watch_rejoining(engine) -> set[str]:
    """The clients that rejoin the queue during a step (a request preempted when its client
    had nothing else waiting): each left the queue earlier in that step, so it was not
    backlogged throughout it. The engine tells its `on_preempt` observers before it requeues;
    the caller clears the set before each step."""
    rejoined: set[str] = set()

    def preempting(request: Request) -> None:
        if all(r.client_id != request.client_id for r in engine.scheduler.waiting()):
            rejoined.add(request.client_id)

    engine.on_preempt.append(preempting)
    return rejoined
