"""The instructor's answer to d1 (`course/design/quota.py`): VTC over the clients with room.

A client whose next request would take it over its quota cannot be served, so for fairness it
is treated as not waiting: it leaves Q (Algorithm 2's set of waiting clients) when its quota
blocks it and joins again, lifted as any joining client is, when a finished request frees
room. Q is then "the clients that could be served now", and Lemma 4.3's argument runs on it
unchanged: every counter in Q stays within U of the smallest. Ours, not the paper's (the paper
has no quotas). Kept out of the student edition with the rest of `instructor/`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from minivtc.fairness.cost import PAPER_COST, Cost
from minivtc.fairness.scheduler import Scheduler
from minivtc.requests.request import Request

__all__ = ["QuotaVTC"]

BOUND = (
    "Two clients in Q over an interval (waiting, with room in their quotas: every client "
    "without a quota that waits) receive service within 2U of each other, U = max(w_p L_input, "
    "w_q M), w_p <= w_q, under full reservation, no preemption and no refunds. Q is the set of "
    "clients with a request that fits their quota room; a client enters Q (on arrival, or "
    "when on_finish frees its room) lifted to the smallest counter in Q, or to the last to "
    "leave Q's when Q is empty, so the lift never lowers a counter. The pick is the smallest "
    "counter in Q, charged h(n_p, 0) at dispatch, so it rises at most w_p L_input above the "
    "minimum; its running requests add at most w_q M while it waits. So Lemma 4.3 holds in Q: "
    "every counter in Q is within U of the smallest. Service over an interval is the change "
    "of the counter (no lift happens to a client that stays in Q), and two counters within U "
    "at both ends give a gap within 2U. A client blocked by its quota is outside Q: its lost "
    "turns are its quota's doing, and on rejoining it is lifted, so it banks nothing. Near "
    "the bound: Theorem 4.8's flood beside a capped client."
)


class QuotaVTC(Scheduler):
    """VTC whose Q holds the clients that have room in their quotas (the module docstring)."""

    BOUND = BOUND

    def __init__(self, quotas: dict[str, int] | None = None, cost: Cost = PAPER_COST) -> None:
        self.quotas, self.cost = dict(quotas or {}), cost
        self.name = "quota-vtc"
        self.queues: dict[str, deque[Request]] = {}  # first-seen order: ties go to the first
        self.counters: dict[str, float] = {}
        self.held: dict[str, int] = {}  # tokens reserved by each client's running requests
        self.charged: dict[str, float] = {}  # request id -> h(n_p, n_q) charged so far
        self.in_q: set[str] = set()  # the clients that could be served now
        self.last_left: str | None = None

    def add(self, request: Request, now: float) -> str | None:
        client, quota = request.client_id, self.quotas.get(request.client_id)
        if quota is not None and request.max_num_tokens > quota:
            return (
                f"prompt + max_tokens = {request.max_num_tokens} exceeds {client}'s quota {quota}"
            )
        self.queues.setdefault(client, deque()).append(request)
        self.update(client)
        return None

    def peek(self) -> Request | None:
        client = min(
            (c for c in self.queues if c in self.in_q), key=self.counters.__getitem__, default=None
        )
        return None if client is None else self.queues[client][0]

    def dispatch(self, request: Request) -> None:
        client = request.client_id
        assert self.queues[client][0] is request, "dispatch takes the request peek offered"
        if not request.num_preemptions:  # a readmitted request paid its prompt already
            self.charged[request.request_id] = self.cost(request.num_prompt, 0)
            self.counters[client] += self.charged[request.request_id]
        self.queues[client].popleft()
        self.held[client] = self.held.get(client, 0) + request.max_num_tokens
        self.update(client)

    def on_decode(self, requests: list[Request]) -> None:
        for r in requests:
            now = self.cost(len(r.prompt_ids), len(r.output_ids))
            self.counters[r.client_id] += now - self.charged[r.request_id]
            self.charged[r.request_id] = now

    def on_finish(self, request: Request) -> None:
        self.charged.pop(request.request_id, None)
        self.held[request.client_id] -= request.max_num_tokens
        self.update(request.client_id)  # room freed: it may join Q again

    def remove(self, request: Request) -> None:
        self.queues[request.client_id].remove(request)
        self.update(request.client_id)

    def requeue(self, request: Request) -> None:
        self.held[request.client_id] -= request.max_num_tokens  # its memory was freed
        self.queues[request.client_id].appendleft(request)
        self.update(request.client_id)

    def waiting(self) -> Iterator[Request]:
        return (r for q in self.queues.values() for r in q)

    def gap_bound(self, u: float) -> float | None:
        return 2 * u

    def check_invariants(self) -> None:
        for c in self.queues:
            assert (c in self.in_q) == self.has_room(c), f"{c} is in Q iff it has room"

    def update(self, client: str) -> None:
        """`client` joins Q (lifted) or leaves it, as its queue and its room now say."""
        if self.has_room(client) and client not in self.in_q:
            floor = self.floor()
            self.counters[client] = max(self.counters.get(client, 0.0), floor)
            self.in_q.add(client)
        elif not self.has_room(client) and client in self.in_q:
            self.in_q.discard(client)
            self.last_left = client

    def has_room(self, client: str) -> bool:
        """A request waits, and the first fits what its quota leaves."""
        queue, quota = self.queues.get(client), self.quotas.get(client)
        if not queue:
            return False
        return quota is None or self.held.get(client, 0) + queue[0].max_num_tokens <= quota

    def floor(self) -> float:
        """The lift's floor: the smallest counter in Q, or the last to leave Q's."""
        if self.in_q:
            return min(self.counters[c] for c in self.in_q)
        return self.counters.get(self.last_left, 0.0) if self.last_left else 0.0
