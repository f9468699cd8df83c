"""Preemption, with blocks on demand (reservation "none"; the paper's Appendix C.3 asks for
fair preemption): whom to preempt, and what a preempted request keeps.

Owns the victims and `Preemption`:

- `Latest` (vLLM's): the most recently admitted request, when running requests outgrow the
  pool;
- `Fair`: a request of the running client with the highest counter, its youngest; it also
  displaces a running client more than `gap` ahead of a waiting one, to admit it;
- `Preemption`: by recompute, a victim keeps nothing but its tokens, and is prefilled again
  when it is admitted again, from what a prefix cache still holds then; by swap, its keys and
  values are copied to host memory and back, within `swap_tokens` of host memory (past that
  it recomputes). It counts the waste: `recomputed_tokens` (positions a request had held,
  computed again) and `swapped_tokens` (copied out, and back in).

Each victim answers the engine's questions (`choose`, `displace`); the engine preempts. Nothing
here is charged to a client. Lesson 10.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minivtc.engine.engine_config import EngineConfig
from minivtc.engine.kv_pool import BlockAllocator
from minivtc.fairness.cost import weights_of
from minivtc.fairness.scheduler import Scheduler
from minivtc.requests.request import Request

__all__ = ["Fair", "Latest", "Preemption", "make_victim"]

if TYPE_CHECKING:
    from minivtc.engine.runner import Runner


class Latest:
    """vLLM's victim: the most recently admitted request (the last of the running list)."""

    name = "latest"

    def choose(self, running: list[Request]) -> Request:
        return running[-1]

    def displace(self, request: Request, running: list[Request]) -> Request | None:
        return None  # preempts only when running requests outgrow the pool


class Fair:
    """The fair victim: a request of the running client whose counter is highest (it has
    received the most), the youngest of that client's requests.

    It is also chosen to make room for a waiting client (`displace`): when the request the
    scheduler offers does not fit, a running request of a client more than `gap` ahead of
    the waiting one (in counter units) is preempted, highest counter first, until it fits.
    That is Appendix C.3's "preempt high-counter clients": a client running ahead can no
    longer keep its blocks while a client far behind it waits, which replaces the M term of
    Lemma 4.3 by `gap` (`cost.preemptive_bound`). `gap` trades fairness for recomputation:
    a request displaced at gap g is readmitted only when its client is the smallest waiting,
    so each displacement of a client follows g of service gained over the one it made room
    for.
    """

    name = "fair"

    def __init__(self, scheduler: Scheduler, gap: float) -> None:
        self.scheduler, self.gap = scheduler, gap

    def choose(self, running: list[Request]) -> Request:
        counter = self.counters()
        # max() keeps the first of equals: scan youngest first, so ties go to the youngest.
        return max(reversed(running), key=lambda r: counter.get(r.client_id, 0.0))

    def displace(self, request: Request, running: list[Request]) -> Request | None:
        """A running request to preempt so that waiting `request` may be admitted, or None."""
        if not running:
            return None
        counter = self.counters()
        victim = self.choose(running)
        above = counter.get(victim.client_id, 0.0) - counter.get(request.client_id, 0.0)
        return victim if above > self.gap else None

    def counters(self) -> dict[str, float]:
        return self.scheduler.ledger.counters()  # a client without one: 0.0 (`get`)


def make_victim(
    config: EngineConfig, scheduler: Scheduler, allocator: BlockAllocator
) -> Latest | Fair | None:
    """The victim blocks on demand preempt (None with a reservation: it never preempts). The
    fair victim's gap: the config's, else the policy's default (the policy adapts its lift:
    `Ledger.set_preempt_gap`)."""
    if config.reservation != "none":
        return None
    if not config.fair_victim:
        return Latest()
    if config.preempt_gap is not None:
        refuse_thrashing(config.preempt_gap, scheduler, allocator.block_size)
    gap = scheduler.ledger.set_preempt_gap(config.preempt_gap, allocator.num_tokens)
    return Fair(scheduler, gap)


def refuse_thrashing(gap: float, scheduler: Scheduler, block_size: int) -> None:
    """A readmitted request's client was the smallest waiting one; it is displaced again only
    once it leads a waiting client by more than `gap`, and one step raises it by w_q per
    request it runs. Below one block of that charge, w_q * block_size, it may be displaced
    before its requests have generated a block between them, and every readmission
    recomputes it all: the engine thrashes (with gap 1, 30 requests took 9,687 preemptions).
    The charge is in counter units: a weight w < 1 raises a counter 1/w times faster, so the
    least gap is w_q * block_size / w for the smallest such weight. U_P = max(gap, w_p L_input)
    + w_q B is untouched: a smaller gap never lowers it below w_p L_input, so a gap under the
    longest prompt's charge buys no bound, only recomputation. A policy without counters
    (FCFS) displaces nothing, whatever the gap."""
    if not scheduler.ledger.keeps_counters:
        return
    scale = 1.0 / min(min(scheduler.ledger.client_weights().values(), default=1.0), 1.0)
    least = weights_of(scheduler.cost)[1] * block_size * scale
    if gap < least:
        raise ValueError(
            f"preempt_gap {gap:g} is below one block's decode charge, w_q x block_size = "
            f"{least:g}: a readmitted request could be displaced again before it "
            "generated a block, and each readmission recomputes it (the engine thrashes)"
        )


class Preemption:
    """What a victim keeps (`config.preemption`), and the waste that costs."""

    def __init__(
        self,
        config: EngineConfig,
        allocator: BlockAllocator,
        cache: BlockAllocator | None = None,
    ) -> None:
        self.swaps, self.allocator, self.cache = config.swaps, allocator, cache
        # Host memory for swapped-out keys and values, in tokens, and the requests whose keys
        # and values are there (num_computed tokens each).
        swap_tokens = config.swap_tokens
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
        named = self.cache.named_tokens(request.request_id, n) if self.cache else 0
        if self.swaps and n - named > 0 and n <= self.swap_tokens - self.host_tokens:
            runner.swap_out(request, self.allocator)
            self.on_host.add(request.request_id)
            self.host_tokens += n
            self.swapped_tokens += n
        else:  # recompute (or the host is full): counted when it is prefilled again
            self.thrown[request.request_id] = n
            request.num_computed = 0

    def readmit(self, request: Request, cached: int, runner: Runner) -> None:
        """`request`, preempted, was admitted again. Swapped out, its keys and values come
        back past the `cached` positions the prefix cache holds; recomputed, its prefill
        starts after them, and what it had held beyond them counts as recomputed."""
        if request.request_id in self.on_host:
            self.on_host.remove(request.request_id)
            self.host_tokens -= request.num_computed
            back = min(cached, request.num_computed)
            runner.swap_in(request, self.allocator, back)
            self.swapped_tokens += request.num_computed - back
            return
        request.num_computed = cached
        self.recomputed_tokens += max(self.thrown.pop(request.request_id) - cached, 0)

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
