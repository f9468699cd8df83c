"""One fair queue in front of many backends: the central dispatcher of Appendix C.3.

Owns `Dispatcher`: every tenant's queue and counter, kept by the same scheduler classes the
engine uses (VTC, weighted VTC, FCFS, DRR, ...) through the same interface, in front of N
backends (`backend.py`). The admission round is Algorithm 2's, over the fleet:

    while (r := scheduler.peek()) is not None:          who is next: the policy
        room <- the healthy backends where r fits        prompt + max_tokens (full reservation)
        b <- route.choose(r, room); none: stop           where: the route (`backend.py`)
        reserve r on b; scheduler.dispatch(r)            c_k <- c_k + h(n_p, 0)

A request is bound to a backend only when that backend has room, so backends never queue and
this order is the only order; the round stops at the first request that fits nowhere (never
skip: Algorithm 2). Output tokens are charged as they come back (`on_decode`); a request that
ends frees its reservation (`on_finish`); one a backend refused before serving it (HTTP 429 or
503) is given back, uncharged (`give_back`).

The bound (the exact view: the dispatcher learns of every token when it is generated). Let
M = the sum of the backends' budgets, L_input the longest admissible prompt, w_p <= w_q. Then
at all times the waiting clients' counters are within U = max(w_p L_input, w_q M) of each
other, and two clients backlogged throughout [t1, t2) receive service within 2U.

Proof: Lemma 4.3's and Theorem 4.4's, with the fleet's memory for one engine's (the course's
argument, problem set 1, Problem 2; the paper's proof is not reproduced): every request bound
holds its prompt + max_tokens on some backend, so the fleet's M plays one engine's. With
w_p > w_q the same argument gives w_p n_p + w_q (M - n_p), at most the course's U (not the
paper's; `cost.fairness_bound`), which the check asserts. Weighted (Section 4.3), the bound holds
in counter units (`fairness_check.py` scales by the smallest weight).

M is the whole fleet's memory, as Appendix C.3 expects: the bound grows with N, because a client
may hold requests on every backend at once, and routing changes no counter, so prefix-aware
routing keeps it. `check_fairness` asserts Lemma 4.3 over the fleet after every arrival,
dispatch and step, reusing the engine's `FairnessCheck` with M = the sum of the budgets.
Plain Python: the simulator (`replicas.py`) and the gateway (`gateway.py`) both run it. One of
k gateways sharing a store also asks its `member` (`fleet_member.py`) in the round: whether
its head may go (no smaller counter waits at another gateway), and to book the room in the
store (refused: another gateway took it, look again); its bound is stated there.

A dispatcher that learns of the replicas' progress late (`minivtc simulate --replicas N
--staleness TAU`): `News` holds what each replica's step did (its output tokens, its finished
requests) and delivers it `staleness` seconds after the step ends, as over a network or a
polling loop. A request's tokens are charged when their news arrives, and a finished request's
room is freed then, so the dispatcher never books room that is not free. The bound with a view
up to tau seconds stale: two backlogged clients' service differs by at most 2U + 2 w_q G, G the
most output tokens one client had generated and not yet been charged for, at any moment (the
course's bound, not the paper's; problem set 2, Problem 6, proves it and bounds G).
`News.most_unseen` is the largest G the run met, and the reported bound uses it.
minivtc/fleet/README.md; Lesson 14.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Protocol

from minivtc.fairness.fairness_check import FairnessCheck
from minivtc.fairness.scheduler import Scheduler, admission_round
from minivtc.fleet.backend import Backend, LeastLoaded, Route
from minivtc.requests.request import Request

__all__ = ["Dispatcher", "News"]


class Member(Protocol):
    """What the round asks a gateway that shares a store with others (`fleet_member.Member`)."""

    def may_dispatch(self, request: Request) -> bool: ...

    def book(self, request: Request, backend: Backend) -> bool: ...

    def rooms_grew(self) -> bool: ...


class Dispatcher:
    """`scheduler`: the policy, holding every tenant's queue and counter; `backends`: the
    fleet; `route`: where among those with room (default least-loaded)."""

    def __init__(
        self,
        scheduler: Scheduler,
        backends: list[Backend],
        route: Route | None = None,
        check_fairness: bool = False,
        member: Member | None = None,
    ) -> None:
        if not backends:
            raise ValueError("a dispatcher needs at least one backend")
        self.scheduler, self.backends = scheduler, list(backends)
        self.route = route or LeastLoaded()
        self.member = member  # one of k gateways sharing a store (`fleet_member.py`), or alone
        self.where: dict[str, Backend] = {}  # request id -> the backend it is bound to
        self.order = {b: k for k, b in enumerate(self.backends)}  # a backend -> its place
        self.stuck: str | None = None  # the head that fitted nowhere when a round stopped
        self.grown: set[Backend] = set()  # the backends whose room grew since then
        self.largest = max(b.budget for b in self.backends)
        total = sum(b.budget for b in self.backends)
        self.fairness = None
        if check_fairness:  # Lemma 4.3 with the fleet's memory: L_input, M = the budgets
            self.fairness = FairnessCheck(scheduler, self.largest - 1, total, total, "full", None)

    def add(self, request: Request, now: float) -> str | None:
        """Queue `request`; a reason if it is refused (it fits no backend, or the policy's)."""
        if request.max_num_tokens > self.largest:
            return (
                f"prompt + max_tokens = {request.max_num_tokens} tokens fits no backend "
                f"(the largest budget is {self.largest})"
            )
        reason = self.scheduler.add(request, now)
        self.check()  # its client may have joined Q, lifted
        return reason

    def bind(self) -> list[tuple[Request, Backend]]:
        """Algorithm 2's admission round over the fleet (the module docstring, `admission_round`);
        returns what was bound where, for the caller to send."""
        bound: list[tuple[Request, Backend]] = []

        def place(request: Request) -> bool:  # a backend with room, or the round stops
            if self.member is not None and not self.member.may_dispatch(request):
                return False  # a smaller counter waits at another gateway (`fleet_member.py`)
            backend = self.booked(request)
            if backend is None:
                self.stuck, self.grown = request.request_id, set()
                return False
            self.stuck = None
            backend.reserve(request)
            self.route.served(request, backend)
            self.where[request.request_id] = backend
            bound.append((request, backend))
            return True

        admission_round(self.scheduler, place, self.dispatched)
        return bound

    def booked(self, request: Request) -> Backend | None:
        """A backend with room for `request`, booked in the store when gateways share one (None:
        none has room). Another gateway may free room since the last sync, or take a room first:
        then look again."""
        while True:
            backend = self.route.choose(request, self.room_for(request))
            if backend is None:
                if self.member is not None and self.member.rooms_grew():
                    continue  # other gateways freed room since the last sync
                return None
            if self.member is None or self.member.book(request, backend):
                return backend
            # another gateway took that room first: look again

    def dispatched(self, request: Request) -> None:
        """`request` was just dispatched: its charge to the check, then Lemma 4.3's spread."""
        if self.fairness is not None:
            self.fairness.dispatched(request)
        self.check()

    def room_for(self, request: Request) -> list[Backend]:
        """The healthy backends where `request` fits, in the fleet's order (the routes' ties)."""
        pool = self.backends
        if request.request_id == self.stuck:
            # PERF: the head that fitted nowhere can fit now only where room was freed since
            # (a reservation only shrinks room; `wake` forgets it), so a decision scans the
            # backends once, not twice (what it measured: minivtc/bench/README.md)
            pool = sorted(self.grown, key=self.order.__getitem__)
        # PERF: `Backend.fits` inlined (need computed once): this loop runs once per backend
        # per decision (what it measured: minivtc/bench/README.md)
        need = request.max_num_tokens
        return [b for b in pool if b.healthy and b.reserved + b.elsewhere + need <= b.budget]

    def on_decode(self, requests: list[Request]) -> None:
        """Each of `requests` got one more output token (already in its `output_ids`)."""
        self.scheduler.on_decode(requests)
        self.check()

    def on_finish(self, request: Request) -> Backend:
        """`request` ended (finished, aborted, or its backend failed): its room is free, what
        it was charged stays charged. Returns the backend it ran on."""
        backend = self.where.pop(request.request_id)
        backend.release(request.request_id)
        backend.served += 1
        self.grown.add(backend)
        self.scheduler.on_finish(request)
        return backend

    def give_back(self, request: Request) -> None:
        """The backend refused `request` before serving it (429, 503, refused connection): it
        waits again, first of its client, and its prompt charge is refunded (`uncharge`)."""
        backend = self.where.pop(request.request_id)
        backend.release(request.request_id)
        self.grown.add(backend)
        self.uncharge(request)
        self.check()

    def wake(self) -> None:
        """A backend's health changed (the gateway's checks): the next round looks again."""
        self.stuck = None

    def waiting(self) -> int:
        return self.scheduler.num_waiting

    def check(self) -> None:
        """Lemma 4.3 over the fleet (with `check_fairness`): the waiting counters' spread."""
        if self.fairness is not None:
            self.fairness.check_spread()

    def check_invariants(self) -> None:
        """Each backend's books, within its budget; every bound request on its backend."""
        for b in self.backends:
            b.check_invariants()
            assert b.reserved <= b.budget, f"{b.name}: reserved {b.reserved} > {b.budget}"
        assert sum(len(b.requests) for b in self.backends) == len(self.where), "lost a binding"
        self.scheduler.check_invariants()

    def gap_bound(self) -> float | None:
        """2U with M the fleet's memory (None without check_fairness)."""
        return self.fairness.gap_bound() if self.fairness is not None else None

    def settle(self, request: Request, num_prompt: int, num_output: int) -> None:
        """The backend's final `usage` corrects what was charged: a prompt the gateway
        estimated with its own tokenizer, output counted from stream chunks (`VTCLedger.settle`: a
        correction downwards stops at the smallest waiting counter). Call before
        `on_finish`, with `request.output_ids` as long as `num_output`."""
        self.scheduler.ledger.settle(request, num_prompt, num_output)

    def uncharge(self, request: Request) -> None:
        """Refund the prompt charged at dispatch and requeue: as if never dispatched."""
        self.scheduler.ledger.unadmit(request)
        self.scheduler.requeue(request)


# --- a stale view ----------------------------------------------------------------------------


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
