"""What a preempted request keeps, and what that costs the server (blocks on demand,
reservation "none"; the paper's Appendix C.3 asks for fair preemption).

Owns `Preemption`: by recompute, a victim keeps nothing but its tokens, and is prefilled again
when it is admitted again, from what a prefix cache still holds then; by swap, its keys and
values are copied to host memory and back, within `swap_tokens` of host memory (past that it
recomputes). It counts the waste: `recomputed_tokens` (positions a request had held, computed
again) and `swapped_tokens` (copied out, and back in). Whom to preempt is `admission.py`'s
choice, when is the engine's; nothing here is charged to a client. Lesson 9.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minivtc.core.kv_pool import BlockAllocator
from minivtc.core.request import Request

if TYPE_CHECKING:
    from minivtc.core.engine import Runner


class Preemption:
    def __init__(self, mode: str, swap_tokens: int | None, allocator: BlockAllocator) -> None:
        if mode not in ("recompute", "swap"):
            raise ValueError(f"preemption must be 'recompute' or 'swap', got {mode!r}")
        if swap_tokens is not None and not swap_tokens >= 0:
            raise ValueError(f"swap_tokens must be >= 0, got {swap_tokens}")
        self.mode, self.allocator = mode, allocator
        # Host memory for swapped-out keys and values, in tokens, and the requests whose keys
        # and values are there (num_computed tokens each).
        self.swap_tokens = allocator.num_tokens if swap_tokens is None else swap_tokens
        self.on_host: set[str] = set()
        self.host_tokens = 0
        # Preempted by recompute: request id -> the positions it had held (what is prefilled
        # again on readmission, but what a prefix cache then holds).
        self.thrown: dict[str, int] = {}
        self.recomputed_tokens = 0  # keys and values computed again after a preemption: waste
        self.swapped_tokens = 0  # tokens whose keys and values went to host memory and back

    def keep(self, request: Request, runner: Runner) -> None:
        """`request` is being preempted (its blocks are freed next): swap its keys and values
        out, or throw them away."""
        n = request.num_computed
        # Positions in blocks the prefix cache names outlive the request (evictable): one
        # with nothing past them (preempted before its prefill) has nothing to keep. The copy
        # holds them too, as the cache may evict them before the request comes back.
        own = n - self.allocator.named_tokens(request.request_id, n)
        if self.mode == "swap" and own > 0 and n <= self.swap_tokens - self.host_tokens:
            runner.swap_out(request, self.allocator)
            self.on_host.add(request.request_id)
            self.host_tokens += n
            self.swapped_tokens += n
        else:  # recompute (or the host is full): counted when it is prefilled again
            self.thrown[request.request_id] = n
            request.num_computed = 0

    def readmit(self, request: Request, cached: int, runner: Runner) -> bool:
        """`request` was admitted; False if it was never preempted. Swapped out, its keys and
        values come back past the `cached` positions the prefix cache holds; recomputed, its
        prefill starts after them, and what it had held beyond them counts as recomputed."""
        if request.request_id in self.on_host:
            self.on_host.remove(request.request_id)
            self.host_tokens -= request.num_computed
            back = min(cached, request.num_computed)
            runner.swap_in(request, self.allocator, back)
            self.swapped_tokens += request.num_computed - back
            return True
        if request.request_id in self.thrown:
            request.num_computed = cached
            self.recomputed_tokens += max(self.thrown.pop(request.request_id) - cached, 0)
            return True
        return False

    def forget(self, request: Request) -> None:
        """`request` is gone (finished or aborted): its host copy's room is free again (the
        runner drops the copy itself)."""
        if request.request_id in self.on_host:
            self.on_host.remove(request.request_id)
            self.host_tokens -= request.num_computed
        self.thrown.pop(request.request_id, None)

    def check(self, requests: dict[str, Request]) -> None:
        on_host = sum(requests[i].num_computed for i in self.on_host)
        assert self.host_tokens == on_host <= self.swap_tokens, (self.host_tokens, on_host)
