"""Admission: may a request join the running batch, given the KV blocks it will need?

Owns the checks the engine can make, each a small policy object over the block allocator:

- `FullReservation` (the paper's model): reserve a request's whole length, prompt +
  max_tokens, when it is admitted. Decode can then never run out of blocks, and the M of
  Lemma 4.3 and Theorem 4.4 is the pool's size. Most of a generous reservation is never used.
- `PeakReservation` (the official artifact's check; lessons/artifact_deviations.md): admit if
  the pool's *peak* fits, with every running request growing to its max_tokens in order of
  what it has left; blocks are allocated as requests grow, and the check guarantees they can be.

- `OnDemand` (vLLM's and SGLang's way; the paper's Appendix C.3 asks for it): admit when the
  request's tokens plus one block of headroom fit; allocate blocks as requests grow; when a
  step's growth does not fit, preempt running requests, chosen by a victim policy, until it
  does. A preempted request is recomputed: its blocks are freed, it waits at the head of its
  client's queue keeping the tokens it generated, and on re-admission its prompt and those
  tokens are prefilled again (or, with the engine's preemption="swap", its keys and values
  go to host memory and come back: `Engine.preempt`). Victims: `Latest` (vLLM's: the most
  recently admitted) or `Fair` (a request of the running client with the highest counter,
  its youngest).

Each answers three calls: `try_admit(request)` (reserve its blocks if they fit),
`grow(batch, preempt)` (before a step: blocks for the positions it writes, preempting through
the engine's `preempt` if they do not fit) and `release(request)`. Does not own the blocks
(`kv_pool.py`) or who is running (`engine.py`). Plain Python: no tensors. Lessons 3 and 9.
"""

from __future__ import annotations

from collections.abc import Callable

from minivtc.core.kv_pool import BlockAllocator
from minivtc.core.request import Request
from minivtc.core.scheduler import Scheduler

Preempt = Callable[[Request], None]


class FullReservation:
    """Reserve prompt + max_tokens at admission."""

    name = "full"

    def __init__(self, allocator: BlockAllocator) -> None:
        self.allocator = allocator

    def try_admit(self, request: Request) -> bool:
        """Reserve blocks for prompt + max_tokens if they are free; else take nothing."""
        prompt, salt = request.prompt_ids, request.cache_salt  # (for a prefix cache)
        if not self.allocator.can_allocate(request.max_num_tokens, prompt, salt):
            return False
        self.allocator.allocate(request.request_id, request.max_num_tokens, prompt, salt)
        return True

    def grow(self, batch: list[Request], preempt: Preempt) -> None:
        pass  # everything was reserved at admission

    def displace(self, request: Request, running: list[Request]) -> Request | None:
        return None  # never preempts

    def release(self, request: Request) -> None:
        self.allocator.free(request.request_id)

    def check(self, running: list[Request]) -> None:
        pass


class PeakReservation:
    """Admit if the most blocks the batch will ever hold, with the newcomer, fit the pool.

    Each running request's occupancy is a line: during step T it holds base + T - 1
    positions, until its last step (`span`). Both numbers are fixed at admission (one token
    per step), so the check reads no request, only the spans.
    """

    name = "peak"

    def __init__(self, allocator: BlockAllocator) -> None:
        self.allocator = allocator
        self.num_steps = 0  # steps that ran a batch: step T is the T-th
        self.spans: dict[str, tuple[int, int]] = {}  # request id -> (last, base)
        self.final_blocks = 0  # blocks the running requests will hold at their last step

    def try_admit(self, request: Request) -> bool:
        # If every running request and this one fit at their final lengths, the peak fits
        # too (it is at most that sum); only a tight pool needs the peak itself.
        final = self.allocator.blocks_needed(request.max_num_tokens - 1)
        if self.final_blocks + final > self.allocator.num_blocks:
            if self.peak_blocks(request) > self.allocator.num_blocks:
                return False
        self.allocator.allocate(
            request.request_id, request.num_tokens, request.prompt_ids, request.cache_salt
        )
        self.final_blocks += final
        self.spans[request.request_id] = self.span(request)
        return True

    def grow(self, batch: list[Request], preempt: Preempt) -> None:
        if not batch:
            return  # no step runs: no step is counted
        self.num_steps += 1
        for r in batch:  # this step writes K/V for positions < num_tokens
            self.allocator.grow(r.request_id, len(r.prompt_ids) + len(r.output_ids))

    def displace(self, request: Request, running: list[Request]) -> Request | None:
        return None  # never preempts

    def release(self, request: Request) -> None:
        self.final_blocks -= self.allocator.blocks_needed(request.max_num_tokens - 1)
        del self.spans[request.request_id]
        self.allocator.free(request.request_id)

    def check(self, running: list[Request]) -> None:
        final = sum(self.allocator.blocks_needed(r.max_num_tokens - 1) for r in running)
        assert self.final_blocks == final, f"final_blocks {self.final_blocks} != {final}"
        spans = {r.request_id: self.span(r) for r in running}
        assert self.spans == spans, f"spans {self.spans} != {spans}: a request fell behind"

    def peak_blocks(self, candidate: Request) -> int:
        """Most blocks the running batch plus `candidate` will ever hold.

        Usage only grows between finishes, so the peak is at some request's last step: with
        requests sorted by last step, latest first, at the k-th one's last step the first k
        are running (every later one has finished), holding sum(base_i) + k (last_k - 1).
        """
        spans = [*self.spans.values(), self.span(candidate)]
        spans.sort(reverse=True)  # latest last step first (the order of ties leaves the max alone)
        if self.allocator.block_size == 1:  # blocks == tokens: a running sum, O(n)
            peak, held = 0, 0
            for k, (last_k, base) in enumerate(spans, start=1):
                held += base
                peak = max(peak, held + k * (last_k - 1))
            return peak
        blocks = self.allocator.blocks_needed
        return max(
            sum(blocks(base + last_k - 1) for _, base in spans[: k + 1])
            for k, (last_k, _) in enumerate(spans)
        )

    def span(self, request: Request) -> tuple[int, int]:
        """(last, base) for a request about to run: with n tokens and s steps left, the coming
        step (T = num_steps + 1) writes K/V for positions < n, and each step after for one
        more, so during step T it holds n + (T - num_steps) - 1 = base + T - 1 positions, with
        base = n - num_steps, until its last step, last = num_steps + s."""
        left = request.params.max_tokens - len(request.output_ids)
        tokens = len(request.prompt_ids) + len(request.output_ids)
        return self.num_steps + left, tokens - self.num_steps


class OnDemand:
    """Blocks as requests grow; when a step's growth does not fit, preempt by recompute."""

    name = "none"  # reserve nothing ahead

    def __init__(self, allocator: BlockAllocator, victim: Latest | Fair) -> None:
        self.allocator, self.victim = allocator, victim

    def try_admit(self, request: Request) -> bool:
        # One block of headroom: a request admitted into the last free block would be the
        # next step's victim. Never more than the request can ever hold, or one that fits the
        # pool only without headroom would wait forever in an empty engine.
        headroom = min(request.num_tokens + self.allocator.block_size, request.max_num_tokens)
        prompt = request.prompt_ids
        if not self.allocator.can_allocate(headroom, prompt, request.cache_salt):
            return False
        self.allocator.allocate(request.request_id, request.num_tokens, prompt, request.cache_salt)
        return True

    def grow(self, batch: list[Request], preempt: Preempt) -> None:
        """`batch` is the engine's running list: `preempt` takes a victim out of it."""
        while self.blocks_short(batch) > 0:
            preempt(self.victim.choose(batch))
        for r in batch:  # this step writes K/V for positions < num_tokens
            self.allocator.grow(r.request_id, len(r.prompt_ids) + len(r.output_ids))

    def displace(self, request: Request, running: list[Request]) -> Request | None:
        """A running request to preempt so that waiting `request` may be admitted, or None."""
        return self.victim.displace(request, running)

    def release(self, request: Request) -> None:
        self.allocator.free(request.request_id)

    def check(self, running: list[Request]) -> None:
        for r in running:
            held = len(self.allocator.block_tables[r.request_id]) * self.allocator.block_size
            assert held >= r.num_computed, f"{r} holds {held} positions, fewer than it computed"

    def blocks_short(self, batch: list[Request]) -> int:
        tables, blocks = self.allocator.block_tables, self.allocator.blocks_needed
        wanted = sum(blocks(r.num_tokens) - len(tables[r.request_id]) for r in batch)
        return wanted - self.allocator.num_free_blocks


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
    for. `gap=None`: never displace (preempt only when the pool runs out).
    """

    name = "fair"

    def __init__(self, scheduler: Scheduler, gap: float | None = None) -> None:
        self.scheduler, self.gap = scheduler, gap

    def choose(self, running: list[Request]) -> Request:
        counter = self.counters()
        # max() keeps the first of equals: scan youngest first, so ties go to the youngest.
        return max(reversed(running), key=lambda r: counter.get(r.client_id, 0.0))

    def displace(self, request: Request, running: list[Request]) -> Request | None:
        if self.gap is None or not running:
            return None
        counter = self.counters()
        victim = self.choose(running)
        above = counter.get(victim.client_id, 0.0) - counter.get(request.client_id, 0.0)
        return victim if above > self.gap else None

    def counters(self) -> dict[str, float]:
        return {c: n or 0.0 for c, (n, _) in self.scheduler.accounts().items()}


VICTIMS = ("latest", "fair")


def make_admission(
    reservation: str,
    allocator: BlockAllocator,
    scheduler: Scheduler,
    victim: str = "latest",
    gap: float | None = None,
) -> FullReservation | PeakReservation | OnDemand:
    """The admission policy by name: "full", "peak" or "none" (on demand, with a victim; the
    fair victim also displaces running clients more than `gap` ahead of a waiting one)."""
    if reservation == "full":
        return FullReservation(allocator)
    if reservation == "peak":
        return PeakReservation(allocator)
    if reservation != "none":
        raise ValueError(f"reservation must be 'full', 'peak' or 'none', got {reservation!r}")
    if victim not in VICTIMS:
        raise ValueError(f"victim must be 'latest' or 'fair', got {victim!r}")
    return OnDemand(allocator, Latest() if victim == "latest" else Fair(scheduler, gap))
