"""The model runner: turns one engine step's requests into tensors, runs the model, samples.

Owns: the flat batch (tokens, positions, slot mapping, per-group block tables), the KV tensors'
use, `torch.compile` of the attention arithmetic, and each request's random generator. It is
the only part of the engine that touches tensors; the simulator replaces it with a step-time model
(same `run` signature) and the engine cannot tell.

A step's batch lists prefilling requests first, then decoding ones. Both are one forward pass
over the flat token batch: the matrix products (most of the work) see every token at once, and
only attention splits into the two groups (`attention.PagedAttention`). The paper's artifact
instead runs prefill and decode as separate passes, stalling the running requests for a step
(lessons/artifact_deviations.md); a fused step keeps them moving and the fairness analysis
does not depend on it. Lesson 3 teaches it.

Shape legend: T tokens in the step, R requests in a group, Q padded new tokens per request,
NB blocks per block-table row, H query heads, D head dim.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from minivtc.engine.kv_pool import BlockAllocator, KVPool
from minivtc.engine.sampler import penalize, record_prompt, record_sampled, sample_each
from minivtc.model.attention import AttentionGroup, PagedAttention, attend_group
from minivtc.model.llama import Llama
from minivtc.requests.request import Request

__all__ = ["ModelRunner", "Runner", "bucket", "build_group"]


class Runner(Protocol):
    """What the engine asks of a runner: this module's `ModelRunner`, or the simulator's
    step-time model (`sim/simulator.py`), which the engine cannot tell apart."""

    def run(self, requests: list[Request], allocator: BlockAllocator) -> Sequence[int | Exception]:
        """One new token per request, or the exception that ended that request's own part."""
        ...

    def release(self, request: Request) -> None: ...

    # preemption="swap" only: a request's computed keys and values to host memory, and back
    # from position `start` (those before it a prefix cache holds)
    def swap_out(self, request: Request, allocator: BlockAllocator) -> None: ...

    def swap_in(self, request: Request, allocator: BlockAllocator, start: int) -> None: ...


class ModelRunner:
    def __init__(self, model: Llama, pool: KVPool, compile_attention: bool = False) -> None:
        self.model = model
        self.pool = pool
        self.device = model.embed_tokens.weight.device
        self.compiled = compile_attention
        self.attend = compiled_attend_group() if compile_attention else attend_group
        self.generators: dict[str, torch.Generator | None] = {}
        # preemption="swap": request id -> the keys and values it had computed, on the host
        self.swapped: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    @torch.inference_mode()
    def run(self, requests: list[Request], allocator: BlockAllocator) -> list[int | Exception]:
        """Compute every request's uncomputed tokens; return one sampled token per request.

        A request whose own part fails (its random generator, its sampling) gets the exception
        in place of a token, and the others are served as if it were not there; a failure of
        the shared forward pass propagates."""
        failed: dict[str, Exception] = {}
        for r in requests:  # before any compute: a request that cannot sample is left out
            try:
                self.generator(r)
            except Exception as e:
                failed[r.request_id] = e
        live = [r for r in requests if r.request_id not in failed]
        ids = [r.request_id for r in live]
        sampled = dict(zip(ids, self.forward(live, allocator), strict=True))
        return [
            failed[r.request_id] if r.request_id in failed else sampled[r.request_id]
            for r in requests
        ]

    def forward(self, requests: list[Request], allocator: BlockAllocator) -> list[int | Exception]:
        """One forward pass over `requests`, one sampled token (or sampling failure) each."""
        if not requests:
            return []
        prefill = [r for r in requests if r.num_tokens - r.num_computed > 1]
        decode = [r for r in requests if r.num_tokens - r.num_computed == 1]
        ordered = prefill + decode
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        last_rows: list[int] = []
        groups: list[AttentionGroup] = []
        prompt_rows: list[int] = []  # prompt_logprobs: the rows of those prompts, in order
        for group in (prefill, decode):
            if group:
                groups.append(
                    build_group(group, len(tokens), allocator, self.compiled, self.device)
                )
            for r in group:
                if wants_prompt_logprobs(r):  # every prompt row but the last (sampled below)
                    prompt_rows += range(
                        len(tokens), len(tokens) + r.num_prompt - r.num_computed - 1
                    )
                tokens += r.uncomputed_ids()
                positions += range(r.num_computed, r.num_tokens)
                slots += allocator.slots(r.request_id, r.num_computed, r.num_tokens)
                last_rows.append(len(tokens) - 1)
        as_tensor = functools.partial(torch.tensor, dtype=torch.long, device=self.device)
        attention = PagedAttention(self.pool.k, self.pool.v, as_tensor(slots), groups, self.attend)
        rows = as_tensor(last_rows + prompt_rows)
        logits = self.model(as_tensor(tokens), as_tensor(positions), attention, rows)  # (N + P, V)
        read_prompt_logprobs(logits[len(ordered) :], ordered)
        sampled = self.sample(logits[: len(ordered)], ordered)
        by_id = {r.request_id: t for r, t in zip(ordered, sampled, strict=True)}
        return [by_id[r.request_id] for r in requests]

    def sample(self, logits: torch.Tensor, requests: list[Request]) -> list[int | Exception]:
        """One token per row (a request's last position): its penalties applied, sampled, and
        the logprobs it asked for read off the model's own logits."""
        processed = penalize(logits, requests, self.model.config.eos_id)
        generators = [self.generators[r.request_id] for r in requests]
        sampled = sample_each(processed, [r.params for r in requests], generators)
        record_sampled(logits, requests, sampled)
        return sampled

    def release(self, request: Request) -> None:
        """The request is gone: drop its random generator (and its keys and values if it was
        swapped out: an aborted request leaves nothing behind)."""
        self.generators.pop(request.request_id, None)
        self.swapped.pop(request.request_id, None)

    def swap_out(self, request: Request, allocator: BlockAllocator) -> None:
        """Copy the keys and values of the request's computed positions to host memory (its
        blocks are freed next)."""
        slots = self.slot_tensor(allocator.slots(request.request_id, 0, request.num_computed))
        k, v = self.flat_pool()
        self.swapped[request.request_id] = (k[:, slots].cpu(), v[:, slots].cpu())  # (NL, n, K, D)

    def swap_in(self, request: Request, allocator: BlockAllocator, start: int) -> None:
        """Copy them back into the request's new blocks, from position `start` (the positions
        before it are in blocks a prefix cache shared with it: left untouched)."""
        k_host, v_host = self.swapped.pop(request.request_id)
        slots = self.slot_tensor(allocator.slots(request.request_id, start, request.num_computed))
        k, v = self.flat_pool()
        k[:, slots] = k_host[:, start:].to(self.device)
        v[:, slots] = v_host[:, start:].to(self.device)

    def flat_pool(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The pool's K and V as (NL, NB * BS, K, D): one row per slot (views, not copies)."""
        nl, _, _, n_kv, d = self.pool.k.shape
        return self.pool.k.view(nl, -1, n_kv, d), self.pool.v.view(nl, -1, n_kv, d)

    def slot_tensor(self, slots: list[int]) -> torch.Tensor:
        return torch.tensor(slots, dtype=torch.long, device=self.device)

    def generator(self, request: Request) -> torch.Generator | None:
        if request.request_id not in self.generators:
            self.generators[request.request_id] = request.params.generator()
        return self.generators[request.request_id]


def wants_prompt_logprobs(request: Request) -> bool:
    """Its first prefill, and it asked for prompt logprobs (a recomputation reads none again)."""
    return (
        request.params.prompt_logprobs is not None
        and request.prompt_logprobs is None
        and request.num_computed < request.num_prompt
    )


def read_prompt_logprobs(logits: torch.Tensor, requests: list[Request]) -> None:
    """Hand each prefilling request that asked for them its rows of `logits` (P, V), in the
    order `ModelRunner.forward` laid them out."""
    start = 0
    for r in requests:
        if wants_prompt_logprobs(r):
            n = r.num_prompt - r.num_computed - 1
            record_prompt(logits[start : start + n], r, r.num_computed)
            start += n


def build_group(
    group: list[Request],
    start: int,
    allocator: BlockAllocator,
    bucketed: bool,
    device: torch.device,
) -> AttentionGroup:
    """Padded (R, Q) layout of one group's new tokens from flat row `start`, and the block
    tables they read. `bucketed`: R, Q, NB rounded up to powers of two (padding never read)."""
    new_counts = [r.num_tokens - r.num_computed for r in group]
    n_rows, n_q = len(group), max(new_counts)
    n_blocks = max(allocator.blocks_needed(r.num_tokens) for r in group)
    if bucketed:  # a few shapes for torch.compile instead of one per batch composition
        n_rows, n_q, n_blocks = (bucket(n) for n in (n_rows, n_q, n_blocks))
    # Plain lists, one tensor each at the end: per-request torch calls cost more (CPU, batch 64)
    token_rows: list[list[int]] = []
    query_positions: list[list[int]] = []
    block_tables: list[list[int]] = []
    out_index: list[int] = []
    offset = 0
    for i, (r, n) in enumerate(zip(group, new_counts, strict=True)):
        token_rows.append([offset + min(j, n - 1) for j in range(n_q)])  # padding repeats a row
        query_positions.append([*range(r.num_computed, r.num_tokens)] + [0] * (n_q - n))
        table = allocator.block_tables[r.request_id][:n_blocks]
        block_tables.append(table + [0] * (n_blocks - len(table)))
        out_index += range(i * n_q, i * n_q + n)
        offset += n
    for _ in range(n_rows - len(group)):  # bucketing's padding rows: one key, never read back
        token_rows.append([0] * n_q)
        query_positions.append([0] * n_q)
        block_tables.append([0] * n_blocks)
    as_tensor = functools.partial(torch.tensor, dtype=torch.long, device=device)
    return AttentionGroup(
        start=start,
        end=start + offset,
        token_rows=as_tensor(token_rows),
        query_positions=as_tensor(query_positions),
        block_tables=as_tensor(block_tables),
        out_index=as_tensor(out_index),
        dense=n_rows == len(group) and all(n == n_q for n in new_counts),
    )


def bucket(n: int) -> int:
    """The next power of two >= n."""
    return 1 << (n - 1).bit_length()


def compiled_attend_group() -> Callable[..., torch.Tensor]:
    """`attend_group` through `torch.compile`, with room for every bucketed shape a server meets."""
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
    return torch.compile(attend_group, dynamic=False)
