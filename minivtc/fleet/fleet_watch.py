"""Theorem 4.4's quantity over a fleet: the largest service gap between two clients over an
interval in which both were backlogged at the fleet's level (a request waiting somewhere:
at the dispatcher, or in any replica's queue).

Owns `FleetWatch`, the fleet's counterpart of `harness/backlog.py`'s `BacklogWatch`: that one
wraps one engine; this one is told, event by event (an arrival, a dispatch round, a replica's
step), which clients were waiting before it and what service each received in it, measured by
the linear price of the tokens processed (w_p per prompt token, w_q per output token, divided by
the client's weight), independently of any counter. A pair's interval starts over when one of
them is not backlogged throughout an event. Plain Python. README: "Fair across replicas"; Lesson 11.
"""

from __future__ import annotations

import itertools
from collections import Counter

from minivtc.core.cost import W_P, W_Q


class FleetWatch:
    def __init__(self, weights: dict[str, float] | None = None) -> None:
        self.weights = dict(weights or {})
        self.num_waiting: Counter[str] = Counter()  # client -> its requests waiting in the fleet
        self.running_diff: dict[tuple[str, str], tuple[float, float, float]] = {}
        self.worst = 0.0  # the largest gap so far
        self.pair: tuple[str, str] | None = None  # and between whom

    def waiting(self) -> frozenset[str]:
        return frozenset(c for c, n in self.num_waiting.items() if n)

    def price(self, num_prompt: int, num_output: int, client: str) -> float:
        return (W_P * num_prompt + W_Q * num_output) / self.weights.get(client, 1.0)

    def event(self, before: frozenset[str], service: dict[str, float]) -> None:
        """One event ended: `before`, the clients waiting when it began; `service`, what each
        received in it. Extend each pair backlogged throughout; the others start over."""
        backlogged = sorted(before & self.waiting())
        diffs = {}
        for f, g in itertools.combinations(backlogged, 2):
            prefix, lo, hi = self.running_diff.get((f, g), (0.0, 0.0, 0.0))
            prefix += service.get(f, 0.0) - service.get(g, 0.0)
            lo, hi = min(lo, prefix), max(hi, prefix)
            diffs[f, g] = (prefix, lo, hi)
            if hi - lo > self.worst:
                self.worst, self.pair = hi - lo, (f, g)
        self.running_diff = diffs
