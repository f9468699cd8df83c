"""The KV pool: key/value tensors cut into fixed-size blocks, and who owns which block.

Owns: `BlockAllocator` (a free list and one block table per request: pure Python, no tensors,
so the simulator and the admission policies use it as is, without importing torch) and
`KVPool` (the K/V tensors plus an allocator, sized from a token capacity — "a pool of 10000
tokens", the paper's unit — or from a byte budget), and `pool_bytes` (vLLM's byte budget: a share
of the device's memory, `gpu_memory_utilization`).

A request's position p lives in block `block_table[p // block_size]` at offset
`p % block_size`; that cell's index in the flattened pool is its *slot*. `block_size=1` is
S-LoRA's token-granular pool, the one the paper ran on; larger blocks waste at most
block_size - 1 slots per request and make the gather in `attention.py` cheaper.

Does not own: which requests may have blocks (the scheduler and engine decide) or attention
arithmetic (`attention.py`). Lesson 2 teaches it.

Shape legend: NL layers, NB blocks, BS block size, K key/value heads, D head dim.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minivtc.model.config import LlamaConfig

__all__ = ["BlockAllocator", "KVPool", "pool_bytes"]

if TYPE_CHECKING:  # KVPool imports torch when it is built: BlockAllocator needs none
    import torch


class BlockAllocator:
    """Blocks for requests. The cached reservation (`can_allocate_cached`, `allocate_cached`,
    `cached_tokens`, `named_tokens`, `cache_prompt`) is part of the interface so the engine
    never asks which pool it has: here nothing is cached, and a prompt buys no block."""

    caches_prefixes = False  # `prefix_cache.PrefixCachingAllocator`: True

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        # A stack, top at the end: blocks are taken and given back in slices (one C-level copy,
        # not a Python loop per block), lowest ids first, and a freed block is reused first.
        self.free_blocks: list[int] = list(range(num_blocks - 1, -1, -1))
        self.block_tables: dict[str, list[int]] = {}

    @property
    def num_tokens(self) -> int:
        """Capacity in tokens: the paper's M when every request's full length is reserved."""
        return self.num_blocks * self.block_size

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)  # ceil division

    def can_allocate(self, num_tokens: int) -> bool:
        """Would `allocate` succeed?"""
        return self.blocks_needed(num_tokens) <= self.num_free_blocks

    def allocate(self, request_id: str, num_tokens: int) -> list[int]:
        """Give `request_id` enough blocks for `num_tokens` positions; its block table.

        A request that already holds blocks is refused (it grows with `grow`), and so is one
        the pool is short for (callers check `can_allocate` first): either way an
        `AssertionError` saying why, with nothing taken and nothing changed.
        """
        assert request_id not in self.block_tables, f"request {request_id!r} already holds blocks"
        n = self.blocks_needed(num_tokens)
        assert n <= len(self.free_blocks), (
            f"request {request_id!r} needs {n} blocks, only {len(self.free_blocks)} free: "
            "callers check can_allocate() first"
        )
        top = len(self.free_blocks) - n
        table = self.free_blocks[top:][::-1]
        del self.free_blocks[top:]
        self.block_tables[request_id] = table
        return table

    def grow(self, request_id: str, num_tokens: int) -> None:
        """Extend a request's block table to cover `num_tokens` positions (lazy allocation)."""
        table = self.block_tables[request_id]
        while len(table) * self.block_size < num_tokens:  # (runs for every token: kept lean)
            assert self.free_blocks, (
                f"request {request_id!r} needs another block and none is free: the admission "
                "check should have made this impossible"
            )
            table.append(self.free_blocks.pop())

    def free(self, request_id: str) -> None:
        """Give all of a request's blocks back (the most recently taken reused first)."""
        assert request_id in self.block_tables, (
            f"double free or unknown request: {request_id!r} holds no blocks"
        )
        self.free_blocks.extend(reversed(self.block_tables.pop(request_id)))

    def slots(self, request_id: str, start: int, end: int) -> list[int]:
        """Flat slot indices of positions start..end-1 of a request (where its K/V go)."""
        assert request_id in self.block_tables, f"use after free: {request_id!r} holds no blocks"
        table, bs = self.block_tables[request_id], self.block_size
        assert end <= len(table) * bs, (
            f"position {end - 1} of {request_id!r} is beyond its {len(table)} blocks"
        )
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def can_allocate_cached(
        self, num_tokens: int, prompt_ids: list[int], salt: str | None = None
    ) -> bool:
        """Would `allocate_cached` succeed? (Without a cache: `can_allocate`.)"""
        return self.can_allocate(num_tokens)

    def allocate_cached(
        self, request_id: str, num_tokens: int, prompt_ids: list[int], salt: str | None = None
    ) -> list[int]:
        """Blocks for `num_tokens` positions, the cached prefix of `prompt_ids` first (without
        a cache: new blocks only, `allocate`)."""
        return self.allocate(request_id, num_tokens)

    def cached_tokens(self, request_id: str) -> int:
        """Prompt tokens whose keys and values `allocate_cached` found in the pool: none."""
        return 0

    def named_tokens(self, request_id: str, num_computed: int) -> int:
        """Positions in blocks a cache names (they outlive the request): none."""
        return 0

    def cache_prompt(
        self, request_id: str, prompt_ids: list[int], num_computed: int, salt: str | None = None
    ) -> None:
        """Name the request's computed prompt blocks for later requests: no cache, no names."""

    def check_invariants(self) -> None:
        """Every block is free or owned by exactly one live request; free + owned == total."""
        owned = [b for table in self.block_tables.values() for b in table]
        free = list(self.free_blocks)
        assert len(set(owned)) == len(owned), "a block is owned by two requests (or twice)"
        assert len(set(free)) == len(free), "a block is on the free list twice"
        assert not set(owned) & set(free), "a block is both free and owned"
        assert len(owned) + len(free) == self.num_blocks, (
            f"{len(owned)} owned + {len(free)} free != {self.num_blocks} blocks: a block leaked"
        )


class KVPool:
    """K and V tensors of shape (NL, NB, BS, K, D) and the allocator that hands out their blocks."""

    def __init__(
        self,
        config: LlamaConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype | None = None,
        device: str | torch.device = "cpu",
        allocator: type[BlockAllocator] = BlockAllocator,
    ) -> None:
        """`dtype` None: float32. `allocator`: the allocator's class (a pool that caches
        prompt blocks passes `prefix_cache.PrefixCachingAllocator`)."""
        import torch

        dtype = dtype or torch.float32
        shape = (config.n_layers, num_blocks, block_size, config.n_kv_heads, config.head_dim)
        try:
            self.allocator = allocator(num_blocks, block_size)
            self.k = torch.zeros(shape, dtype=dtype, device=device)  # (NL, NB, BS, K, D)
            self.v = torch.zeros(shape, dtype=dtype, device=device)  # (NL, NB, BS, K, D)
        except (MemoryError, RuntimeError) as e:  # torch's out-of-memory is a RuntimeError
            if isinstance(e, RuntimeError) and "memory" not in str(e).lower():
                raise
            need = num_blocks * block_size * config.kv_bytes_per_token(dtype.itemsize)
            raise ValueError(
                f"a KV pool of {num_blocks * block_size:,} tokens needs "
                f"{need / 2**30:,.1f} GiB on {device}, more than it could "
                "allocate: ask for fewer tokens"
            ) from None

    @classmethod
    def from_tokens(
        cls, config: LlamaConfig, num_tokens: int, block_size: int = 16, **kw: Any
    ) -> KVPool:
        """A pool holding at least `num_tokens` tokens (rounded up to whole blocks)."""
        if num_tokens < 1:
            raise ValueError(
                f"a KV pool of {num_tokens} tokens holds nothing: give at least one "
                f"block ({block_size} tokens)"
            )
        return cls(config, -(-num_tokens // block_size), block_size, **kw)

    @classmethod
    def from_bytes(
        cls, config: LlamaConfig, num_bytes: int, block_size: int = 16, **kw: Any
    ) -> KVPool:
        """As many whole blocks as fit in `num_bytes` of K and V."""
        import torch

        dtype = kw.get("dtype") or torch.float32
        per_block = config.kv_bytes_per_token(dtype.itemsize) * block_size
        if num_bytes < per_block:
            raise ValueError(f"{num_bytes} bytes do not hold one block ({per_block} bytes)")
        return cls(config, num_bytes // per_block, block_size, **kw)

    @property
    def num_bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


def pool_bytes(utilization: float, device: torch.device) -> int:
    """vLLM's rule: this process may use `utilization` of the device's memory; the KV pool
    gets what that leaves after everything already allocated on it (the weights, and other
    processes'), less a margin for the activations of a step. `LLM(gpu_memory_utilization=...)`
    (`offline/args.py`) and `minivtc serve --gpu-memory-utilization` (`serving/vllm_flags.py`)
    call it, on CUDA."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    budget = int(utilization * total) - (total - free)
    margin = total // 20  # a step's activations (not measured per model: a fixed 5%)
    if budget - margin <= 0:
        raise ValueError(
            f"gpu_memory_utilization={utilization}: {total - free} of {total} bytes are already "
            "in use, which leaves no room for the KV pool"
        )
    return budget - margin
