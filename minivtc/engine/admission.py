"""Admission: may a request's KV blocks be reserved now, and which blocks does a step need?

Owns the checks the engine can make, each a small policy object over the block allocator:

- `FullReservation` (the course's condition for Lemma 4.3's proof; the paper admits a request
  "if it fits in memory"): reserve a request's whole length, prompt + max_tokens, when it is
  admitted. Decode can then never run out of blocks, and the M of
  Lemma 4.3 and Theorem 4.4 is the pool's size. Most of a generous reservation is never used.
- `PeakReservation` (the official artifact's check; lessons/artifact_deviations.md): admit if
  the pool's *peak* fits, with every running request growing to its max_tokens in order of
  what it has left; blocks are allocated as requests grow, and the check guarantees they can be.
- `OnDemand` (vLLM's and SGLang's way; the paper's Appendix C.3 asks for it): admit when the
  request's tokens plus one block of headroom fit; allocate blocks as requests grow. When a
  step's growth does not fit (`blocks_short`), the engine preempts victims (`preemption.py`).

Each answers `reserve(request)` (take its blocks if they fit; else take nothing),
`blocks_short(batch)` (how many blocks the coming step lacks), `grow(batch)` (blocks for the
positions the step writes) and `release(request)`. None calls the engine back: it answers, the
engine decides. With a prefix-caching pool (`prefix_cache.py`) a request starts with its
prompt's cached blocks (`reserve_blocks`). Does not own the blocks (`kv_pool.py`) or who is
running (`engine.py`). Plain Python: no tensors. Lessons 3 and 10.
"""

from __future__ import annotations

from minivtc.engine.kv_pool import BlockAllocator
from minivtc.requests.request import Request

__all__ = ["FullReservation", "OnDemand", "PeakReservation", "make_admission", "reserve_blocks"]


class FullReservation:
    """Reserve prompt + max_tokens at admission."""

    name = "full"

    def __init__(self, allocator: BlockAllocator) -> None:
        self.allocator = allocator

    def reserve(self, request: Request) -> bool:
        """Reserve blocks for prompt + max_tokens if they are free; else take nothing."""
        return reserve_blocks(self.allocator, request, request.max_num_tokens)

    def blocks_short(self, batch: list[Request]) -> int:
        return 0  # everything was reserved at admission

    def grow(self, batch: list[Request]) -> None:
        pass

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

    def reserve(self, request: Request) -> bool:
        # If every running request and this one fit at their final lengths, the peak fits
        # too (it is at most that sum); only a tight pool needs the peak itself.
        final = self.allocator.blocks_needed(request.max_num_tokens - 1)
        if self.final_blocks + final > self.allocator.num_blocks:
            if self.peak_blocks(request) > self.allocator.num_blocks:
                return False
        reserve_blocks(self.allocator, request, request.num_tokens, check=False)
        self.final_blocks += final
        self.spans[request.request_id] = self.span(request)
        return True

    def blocks_short(self, batch: list[Request]) -> int:
        return 0  # the peak check made sure

    def grow(self, batch: list[Request]) -> None:
        if not batch:
            return  # no step runs: no step is counted
        self.num_steps += 1
        for r in batch:  # this step writes K/V for positions < num_tokens
            self.allocator.grow(r.request_id, len(r.prompt_ids) + len(r.output_ids))

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
        left = request.params.limit - len(request.output_ids)
        tokens = len(request.prompt_ids) + len(request.output_ids)
        return self.num_steps + left, tokens - self.num_steps


class OnDemand:
    """Blocks as requests grow; when a step's growth does not fit, the engine preempts."""

    name = "none"  # reserve nothing ahead

    def __init__(self, allocator: BlockAllocator) -> None:
        self.allocator = allocator

    def reserve(self, request: Request) -> bool:
        # One block of headroom: a request admitted into the last free block would be the
        # next step's victim. Never more than the request can ever hold, or one that fits the
        # pool only without headroom would wait forever in an empty engine.
        headroom = min(request.num_tokens + self.allocator.block_size, request.max_num_tokens)
        return reserve_blocks(self.allocator, request, request.num_tokens, fit=headroom)

    def blocks_short(self, batch: list[Request]) -> int:
        """Blocks the coming step needs beyond the free ones (it writes positions <
        num_tokens of every request in `batch`)."""
        tables, blocks = self.allocator.block_tables, self.allocator.blocks_needed
        wanted = sum(blocks(r.num_tokens) - len(tables[r.request_id]) for r in batch)
        return wanted - self.allocator.num_free_blocks

    def grow(self, batch: list[Request]) -> None:
        for r in batch:  # this step writes K/V for positions < num_tokens
            self.allocator.grow(r.request_id, len(r.prompt_ids) + len(r.output_ids))

    def release(self, request: Request) -> None:
        self.allocator.free(request.request_id)

    def check(self, running: list[Request]) -> None:
        for r in running:
            held = len(self.allocator.block_tables[r.request_id]) * self.allocator.block_size
            assert held >= r.num_computed, f"{r} holds {held} positions, fewer than it computed"


def reserve_blocks(
    allocator: BlockAllocator,
    request: Request,
    num_tokens: int,
    fit: int | None = None,
    check: bool = True,
) -> bool:
    """Give `request` blocks for `num_tokens` positions if `fit` positions (default the same)
    would fit; else take nothing. A prefix-caching pool starts it with its prompt's cached
    blocks, shared with the requests of the same salt, and counts only the new ones."""
    fit = num_tokens if fit is None else fit
    prompt, salt = request.prompt_ids, request.cache_salt
    if check and not allocator.can_allocate_cached(fit, prompt, salt):
        return False
    allocator.allocate_cached(request.request_id, num_tokens, prompt, salt)
    return True


Admission = FullReservation | PeakReservation | OnDemand


def make_admission(reservation: str, allocator: BlockAllocator) -> Admission:
    """The admission policy by name ("full", "peak" or "none": `engine_config.EngineConfig`)."""
    if reservation == "full":
        return FullReservation(allocator)
    if reservation == "peak":
        return PeakReservation(allocator)
    return OnDemand(allocator)
