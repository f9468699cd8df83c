"""Theorem 4.4's quantity over a fleet: the largest service gap between two clients over an
interval in which both were backlogged at the fleet's level (a request waiting somewhere:
at the dispatcher, or in any replica's queue).

Owns `FleetWatch`, the fleet's counterpart of `harness/backlog.py`'s `BacklogWatch`: that one
wraps one engine; this one is told, event by event (an arrival, a dispatch round, a replica's
step), which clients were waiting before it and what service each received in it, measured by
the linear price of the tokens processed (w_p per prompt token, w_q per output token, divided by
the client's weight), independently of any counter. A pair's interval starts over when one of
them is not backlogged throughout an event. Plain Python. minivtc/fleet/README.md; Lesson 14.
"""

from __future__ import annotations

import itertools
from collections import Counter

from minivtc.fairness.cost import W_P, W_Q


class FleetWatch:
    def __init__(self, weights: dict[str, float] | None = None) -> None:
        self.weights = dict(weights or {})
        self.num_waiting: Counter[str] = Counter()  # client -> its requests waiting in the fleet
        self.waiting_now: set[str] = set()  # the clients with a request waiting
        self.running_diff: dict[tuple[str, str], tuple[float, float, float]] = {}
        self.backlogged: list[str] = []  # at the last event's end, sorted: the pairs' clients
        self.worst = 0.0  # the largest gap so far
        self.pair: tuple[str, str] | None = None  # and between whom

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
        return (W_P * num_prompt + W_Q * num_output) / self.weights.get(client, 1.0)

    def event(self, before: frozenset[str], service: dict[str, float]) -> None:
        """One event ended: `before`, the clients waiting when it began; `service`, what each
        received in it. Extend each pair backlogged throughout; the others start over."""
        backlogged = sorted(before & self.waiting())
        if backlogged != self.backlogged:  # (rarely: once in 200 events of the real trace)
            old, self.backlogged = self.running_diff, backlogged
            self.running_diff = {
                pair: old.get(pair, (0.0, 0.0, 0.0))
                for pair in itertools.combinations(backlogged, 2)
            }
        if not service:
            return  # an arrival: no pair's difference moved
        # PERF: the pairs' table is updated in place, not rebuilt at every event, and a pair
        # whose difference did not move is left alone (the same pairs, in the same order, the
        # same numbers). With `metrics.service`'s window skip, `minivtc simulate --workload
        # real --replicas 16` took 0.80 of its time (median of 4 alternating pairs, 0.76-0.86).
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
