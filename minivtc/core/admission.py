"""Admission: may a request join the running batch, given the KV blocks it will need?

Owns the two checks the engine can make, each a small policy object over the block allocator:

- `FullReservation` (the paper's model): reserve a request's whole length, prompt +
  max_tokens, when it is admitted. Decode can then never run out of blocks, and the M of
  Lemma 4.3 and Theorem 4.4 is the pool's size. Most of a generous reservation is never used.
- `PeakReservation` (the official artifact's check; lessons/artifact_deviations.md): admit if
  the pool's *peak* fits, with every running request growing to its max_tokens in order of
  what it has left; blocks are allocated as requests grow, and the check guarantees they can be.

Both answer three calls: `try_admit(request)` (reserve its blocks if they fit), `grow(batch)`
(before a step: blocks for the positions it writes) and `release(request)`. Does not own the
blocks (`kv_pool.py`) or who is running (`engine.py`). Plain Python: no tensors. Lesson 3.
"""

from __future__ import annotations

from minivtc.core.kv_pool import BlockAllocator
from minivtc.core.request import Request


class FullReservation:
    """Reserve prompt + max_tokens at admission."""

    name = "full"

    def __init__(self, allocator: BlockAllocator) -> None:
        self.allocator = allocator

    def try_admit(self, request: Request) -> bool:
        if not self.allocator.can_allocate(request.max_num_tokens):
            return False
        self.allocator.allocate(request.request_id, request.max_num_tokens)
        return True

    def grow(self, batch: list[Request]) -> None:
        pass  # everything was reserved at admission

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
        self.allocator.allocate(request.request_id, request.num_tokens)
        self.final_blocks += final
        self.spans[request.request_id] = self.span(request)
        return True

    def grow(self, batch: list[Request]) -> None:
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
        left = request.params.max_tokens - len(request.output_ids)
        tokens = len(request.prompt_ids) + len(request.output_ids)
        return self.num_steps + left, tokens - self.num_steps


ADMISSIONS = {"full": FullReservation, "peak": PeakReservation}
