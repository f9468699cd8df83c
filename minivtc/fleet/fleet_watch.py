"""Theorem 4.4's quantity over a fleet: the largest service gap between two clients over an
interval in which both were backlogged at the fleet's level (a request waiting somewhere:
at the dispatcher, or in any replica's queue).

Owns `FleetWatch`, the fleet's counterpart of `sim/backlog.py`'s `BacklogWatch` (the same
tracker, `PairGaps`): that one wraps one engine; this one is told, event by event (an arrival, a
dispatch round, a replica's step), which clients were waiting before it and what service each
received in it, measured by the linear price of the tokens processed (w_p per prompt token, w_q per
output token, divided by the client's weight), independently of any counter. A pair's interval
starts over when one of them is not backlogged throughout an event. Plain Python.
minivtc/fleet/README.md; Lesson 14.
"""

from __future__ import annotations

from collections import Counter

from minivtc.fairness.cost import linear_price
from minivtc.sim.backlog import PairGaps

__all__ = ["FleetWatch"]


class FleetWatch(PairGaps):
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
