"""Who runs next: the scheduler interface the engine calls, and the policies side by side.

Owns the waiting queue and every policy's state. The engine calls a scheduler at four moments
(PAPER.md §9, Appendix C.1's "three hooks" plus finish):

1. `add(request, now)`       a request arrives; may reject it (a reason string, e.g. RPM);
2. `schedule(admit)`         pick waiting requests in policy order, calling `admit(request)`
                             for each; `admit` returns False when the request does not fit in
                             the KV budget, and the round stops there (head-of-line, as the
                             paper's Algorithm 2 and the artifact's `break`);
3. `on_tokens(request, num_prompt, num_output)`  tokens were processed for a running request
                             (the prompt at admission, then one output token per step);
4. `on_finish(request)`      a running request finished or was aborted.

A scheduler never sees tensors. Does not own: KV blocks (`kv_pool.py`) or running requests
(`engine.py`). Lessons 3-5 teach it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from minivtc.request import Request

Admit = Callable[[Request], bool]


class Scheduler:
    """The interface, with no-op hooks; each policy overrides what it needs."""

    name = "base"

    def add(self, request: Request, now: float) -> str | None:
        raise NotImplementedError

    def schedule(self, admit: Admit) -> None:
        raise NotImplementedError

    def remove(self, request: Request) -> None:
        """A waiting request was aborted: forget it."""
        raise NotImplementedError

    def waiting(self) -> Iterator[Request]:
        raise NotImplementedError

    def on_tokens(self, request: Request, num_prompt: int, num_output: int) -> None:
        pass

    def on_finish(self, request: Request) -> None:
        pass

    def check_invariants(self) -> None:
        pass

    @property
    def num_waiting(self) -> int:
        return sum(1 for _ in self.waiting())


class FCFS(Scheduler):
    """First come, first served: arrival order; stop at the first request that does not fit."""

    name = "fcfs"

    def __init__(self) -> None:
        self.queue: deque[Request] = deque()

    def add(self, request: Request, now: float) -> str | None:
        self.queue.append(request)
        return None

    def schedule(self, admit: Admit) -> None:
        while self.queue and admit(self.queue[0]):
            self.queue.popleft()

    def remove(self, request: Request) -> None:
        self.queue.remove(request)

    def waiting(self) -> Iterator[Request]:
        return iter(self.queue)

    @property
    def num_waiting(self) -> int:
        return len(self.queue)


def make_scheduler(name: str) -> Scheduler:
    """A scheduler from its command-line name."""
    if name == "fcfs":
        return FCFS()
    raise ValueError(f"unknown scheduler {name!r}; choose one of: fcfs")
