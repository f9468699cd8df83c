"""Who runs next: the scheduler interface the engine calls, and the policies side by side.

Owns the waiting queue and every policy's state. The engine asks; a scheduler never calls
back (Algorithm 2's loop is `admission_round`, Appendix C.1's hooks are these methods):

1. `add(request, now)`     a request arrives; may reject it (a reason string, e.g. RPM);
2. `peek()`                the request the policy would dispatch next, or None (Q is empty);
   `dispatch(request)`     the engine admitted the peeked request: take it out of Q and
                           charge its prompt, h(n_p, 0) (Algorithm 2's c_k <- c_k + h(n_p, 0));
3. `on_decode(requests)`   once per step: each of `requests` got one output token;
4. `on_finish(request)`    a dispatched request finished or was aborted (running, or waiting
                           again after a preemption);
   `requeue(request)`      a running request was preempted: it waits again, first of its client;
   `remove(request)`       a waiting request was aborted.

What reports, checks, the fair victim, the server and the gateway read or correct is not this
interface's: it is the policy's books, `scheduler.ledger` (`ledger.py`), never a policy's own
fields.

Algorithm 2's admission round is `admission_round`, written once for every caller (the engine,
the fleet's dispatcher, the course's bench): it stops at the first peeked request that does not
fit (head-of-line, as Algorithm 2 and the artifact's `break`), so a policy never has to undo a
pick. A scheduler never sees tensors (importing this module imports no torch; a test checks
it). The VTC family is `vtc.py`'s, DRR `drr.py`'s, the names on the command line
`policies.py`'s. Does not own: KV blocks (`kv_pool.py`) or running requests (`engine.py`).
Lessons 3-5 teach it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from minivtc.fairness.cost import PAPER_COST, Cost
from minivtc.fairness.ledger import NO_BOOKS, Ledger
from minivtc.requests.request import Request

__all__ = ["FCFS", "RPM", "Scheduler", "admission_round"]


class Scheduler:
    """The interface, with no-op hooks; each policy overrides what it needs."""

    name = "base"
    cost: Cost = PAPER_COST  # what its service is priced by (`cost.py`): the bound's w_p, w_q
    ledger: Ledger = NO_BOOKS  # its books, for the layers that read them (`ledger.py`)

    def add(self, request: Request, now: float) -> str | None:
        raise NotImplementedError

    def peek(self) -> Request | None:
        """The request `dispatch` would take next (the same one until something changes). A
        policy may begin a turn here (DRR): only an admission round calls it."""
        raise NotImplementedError

    def dispatch(self, request: Request) -> None:
        """`request`, the one `peek` offered, was admitted: out of Q, its prompt charged (a
        request with `num_preemptions` was charged at its first dispatch: not again)."""
        raise NotImplementedError

    def remove(self, request: Request) -> None:
        """A waiting request was aborted: forget it."""
        raise NotImplementedError

    def requeue(self, request: Request) -> None:
        """A running request was preempted: it waits again, at the head of its client's queue
        (it arrived before anything its client sent since)."""
        raise NotImplementedError

    def waiting(self) -> Iterator[Request]:
        raise NotImplementedError

    def on_decode(self, requests: list[Request]) -> None:
        """One step gave each of `requests` one output token (one call per step, not per token:
        the simulator makes millions of tokens)."""

    def on_finish(self, request: Request) -> None:
        pass

    def check_invariants(self) -> None:
        pass

    @property
    def num_waiting(self) -> int:
        return sum(1 for _ in self.waiting())


def admission_round(
    scheduler: Scheduler,
    place: Callable[[Request], bool],
    dispatched: Callable[[Request], None] | None = None,
) -> Request | None:
    """Algorithm 2's admission round: peek; `place` the request (reserve its memory; False: it
    fits nowhere now) or stop, never skipping to one that would fit (the argument behind Lemma
    4.3, that a dispatch charges only the smallest counter, and by at most w_p L_input, would
    break); `dispatch` it, charging its prompt now, before the next pick; then `dispatched` (a
    check's bookkeeping). Returns the request the round stopped at (None: Q is empty)."""
    while (request := scheduler.peek()) is not None:
        if not place(request):
            return request
        scheduler.dispatch(request)  # out of Q; its prompt charged (unless readmitted)
        if dispatched is not None:
            dispatched(request)
    return None


class FCFS(Scheduler):
    """First come, first served: arrival order; stop at the first request that does not fit."""

    name = "fcfs"

    def __init__(self) -> None:
        self.queue: deque[Request] = deque()

    def add(self, request: Request, now: float) -> str | None:
        self.queue.append(request)
        return None

    def peek(self) -> Request | None:
        return self.queue[0] if self.queue else None

    def dispatch(self, request: Request) -> None:
        taken = self.queue.popleft()  # arrival order needs no token counts
        assert taken is request, "dispatch takes the request peek offered"

    def remove(self, request: Request) -> None:
        self.queue.remove(request)

    def requeue(self, request: Request) -> None:
        self.queue.appendleft(request)  # it arrived before every request still waiting

    def waiting(self) -> Iterator[Request]:
        return iter(self.queue)

    @property
    def num_waiting(self) -> int:
        return len(self.queue)


class RPM(FCFS):
    """FCFS plus a rate limit: at most `limit` accepted requests per client in any 60 s window.

    The paper's RPM baseline rejects, it does not delay (Section 5.3, Figures 13-14): a
    request over the limit never enters the queue, and the engine turns the reason into an
    error (HTTP 429). Only accepted requests count toward the window.
    """

    window_s = 60.0

    def __init__(self, limit: int) -> None:
        super().__init__()
        if limit < 1:
            raise ValueError(f"rpm limit must be >= 1, got {limit}")
        self.limit = limit
        self.name = f"rpm:{limit}"
        self.accepted: dict[str, deque[float]] = {}  # client -> arrival times in the window
        self.ledger = RPMLedger(self.accepted, self.window_s)

    def add(self, request: Request, now: float) -> str | None:
        times = self.accepted.setdefault(request.client_id, deque())
        while times and times[0] <= now - self.window_s:  # a request exactly 60 s old is out
            times.popleft()
        if len(times) >= self.limit:
            return (
                f"rate limit: client {request.client_id!r} already has {self.limit} requests "
                f"accepted in the last {self.window_s:.0f} s"
            )
        times.append(now)
        return super().add(request, now)


class RPMLedger(Ledger):
    """RPM's books: the accepted requests' times, per client (no counters)."""

    def __init__(self, accepted: dict[str, deque[float]], window_s: float) -> None:
        self.accepted, self.window_s = accepted, window_s

    def forget(self, idle: list[str], now: float) -> list[str]:
        """A client whose window holds no accepted request starts afresh either way."""
        window = now - self.window_s
        gone = [c for c in idle if not any(t > window for t in self.accepted.get(c, ()))]
        for c in gone:
            self.accepted.pop(c, None)
        return gone
