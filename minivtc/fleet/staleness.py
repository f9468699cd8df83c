"""A dispatcher that learns of the replicas' progress late: `minivtc simulate --replicas N
--staleness TAU`.

Owns `News`: what each replica's step did (its output tokens, its finished requests) reaches
the dispatcher `staleness` seconds after the step ends, as over a network or a polling loop.
A request's tokens are charged when their news arrives, and a finished request's room is freed
then, so the dispatcher never books room that is not free.

The bound with a view up to tau seconds stale: two backlogged clients' service differs by
at most 2U + 2 w_q G, G the most output tokens one client had generated and not yet been
charged for, at any moment (the course's bound, not the paper's; problem set 2, Problem 5,
proves it and bounds G). `News.most_unseen` is the largest G the run met, and the reported
bound uses it. Plain Python. minivtc/fleet/README.md; Lesson 14.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from minivtc.requests.request import Request

__all__ = ["News"]


@dataclass(frozen=True, slots=True)
class Seen:
    """A request as the news of one step shows it: its output then (VTC's `on_decode` reads
    `len(output_ids)`; a `range` is as long as a list and costs nothing)."""

    request_id: str
    client_id: str
    prompt_ids: list[int]
    output_ids: range


class News:
    """Replica steps' results, delivered `staleness` seconds after each step ends."""

    def __init__(self, staleness: float) -> None:
        if not staleness >= 0:
            raise ValueError(f"staleness must be >= 0 seconds, got {staleness}")
        self.staleness = staleness
        self.queue: list[tuple[float, int, list[Seen], list[Request]]] = []
        self.order = itertools.count()  # equal times: in the order the steps ran
        self.unseen: dict[str, int] = {}  # client -> output tokens generated, not yet seen
        self.most_unseen = 0  # G: the most a client had unseen at once

    def post(self, now: float, batch: list[Request]) -> None:
        """A step ended at `now`: `batch` ran, each request with its new token."""
        seen = [
            Seen(r.request_id, r.client_id, r.prompt_ids, range(len(r.output_ids))) for r in batch
        ]
        done = [r for r in batch if r.finish_reason is not None]
        heapq.heappush(self.queue, (now + self.staleness, next(self.order), seen, done))
        for r in batch:
            n = self.unseen[r.client_id] = self.unseen.get(r.client_id, 0) + 1
            self.most_unseen = max(self.most_unseen, n)

    @property
    def next_time(self) -> float | None:
        return self.queue[0][0] if self.queue else None

    def due(self, now: float) -> list[tuple[list[Seen], list[Request]]]:
        """Every step's news that has arrived by `now`, oldest first."""
        out = []
        while self.queue and self.queue[0][0] <= now:
            _, _, seen, done = heapq.heappop(self.queue)
            for s in seen:
                self.unseen[s.client_id] -= 1
            out.append((seen, done))
        return out
