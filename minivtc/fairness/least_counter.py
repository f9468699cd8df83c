"""The waiting client with the smallest counter: the choice VTC makes at every dispatch
(Algorithm 2's "k <- the client in Q with the smallest c_k").

Owns `LeastCounter`, a lazy heap (O(log n) a decision), and `LinearScan`, the obvious scan the
artifact does (O(n)), which the tests check it against and `minivtc bench scheduler` times it
against. Both read the scheduler's own dicts (counters, tie ranks, queues): nothing is copied.
Plain Python: no tensors. Lesson 5.
"""

from __future__ import annotations

import heapq
from collections import deque

from minivtc.requests.request import Request

__all__ = ["LeastCounter", "LinearScan"]


class LeastCounter:
    """The waiting client with the smallest counter (ties: the client seen first), in
    O(log n) per decision, where the artifact scans every client (O(n)).

    A heap with lazy deletion: an entry (counter, rank, version, client) is live while its
    client waits and `version` is the client's latest. A live entry's counter may lag behind
    the client's: a charge only raises a counter, so the old key is a lower bound, and the
    entry is re-keyed only when it reaches the top (one heap operation per dispatch instead of
    one per token charged). A counter that falls (a refund) needs a new entry: `push`.
    """

    def __init__(
        self, counters: dict[str, float], rank: dict[str, int], queues: dict[str, deque[Request]]
    ) -> None:
        self.counters, self.rank, self.queues = counters, rank, queues
        self.heap: list[tuple[float, int, int, str]] = []
        self.versions: dict[str, int] = {}
        self.num_entries = 0  # entries made so far: a version is never reused

    def push(self, client: str) -> None:
        """`client` joined the queue, or its counter fell."""
        heapq.heappush(self.heap, self.entry(client))
        if len(self.heap) > 64 and len(self.heap) > 4 * len(self.queues):
            self.compact()

    def compact(self) -> None:
        """Drop the dead entries (the heap stays within a few times the clients)."""
        self.heap = [e for e in self.heap if self.is_live(e[2], e[3])]
        heapq.heapify(self.heap)

    def least(self) -> str | None:
        while self.heap:
            counter, _, version, client = self.heap[0]
            if not self.is_live(version, client):
                heapq.heappop(self.heap)  # superseded by a newer entry, or left the queue
            elif counter != self.counters[client]:  # charged since: re-key, look again
                heapq.heappop(self.heap)
                heapq.heappush(self.heap, self.entry(client))
            else:
                return client  # every other key is a lower bound of its counter
        return None

    def forget(self, client: str) -> None:
        self.versions.pop(client, None)  # its entries are dead

    def check(self) -> None:
        live = {c: k for k, _, v, c in self.heap if self.is_live(v, c)}
        assert live.keys() == {c for c, q in self.queues.items() if q}, "heap lost a client"
        assert all(k <= self.counters[c] for c, k in live.items()), "a key is above its counter"

    def entry(self, client: str) -> tuple[float, int, int, str]:
        self.num_entries += 1
        self.versions[client] = self.num_entries
        return (self.counters[client], self.rank[client], self.num_entries, client)

    def is_live(self, version: int, client: str) -> bool:
        return version == self.versions.get(client) and bool(self.queues[client])


class LinearScan(LeastCounter):
    """The reference: scan every waiting client (what the artifact does). Tests check that
    `LeastCounter` picks exactly as this does; `minivtc bench scheduler` times both."""

    def push(self, client: str) -> None:
        pass

    def least(self) -> str | None:
        waiting = [c for c, q in self.queues.items() if q]
        return min(waiting, key=lambda c: (self.counters[c], self.rank[c]), default=None)

    def check(self) -> None:
        pass
