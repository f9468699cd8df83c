"""Prefix caching: full KV blocks named by the tokens in them and before them, shared between
requests, kept after their last request leaves until the pool needs them back.

Owns `PrefixCachingAllocator`, a `BlockAllocator` whose full prompt blocks are cached. A block's
*hash* chains its tokens to everything before it, hash(previous block's hash, its tokens), so
equal hashes mean equal prefixes: a request whose first k prompt blocks hash as cached ones
takes those blocks (their keys and values are already in the pool) and its prefill starts at
position k * block_size. A block is

- *held* by the requests whose block tables list it (`ref_count` of them),
- *evictable* once none holds it but its hash is cached: kept, in least-recently-used order,
  so the next request with that prefix finds it, and taken back (its hash forgotten) when
  the pool has no free block left: evicting a cached block comes before preempting work,
  because it counts as free (`num_free_blocks`);
- *free* otherwise.

Only full blocks that end before a prompt's last token are shared: the last token is always
computed, so every request gets its own logits and no request writes into a shared block.
Cached blocks are registered after the step that computed them (`cache_prompt`). Plain Python,
no tensors, as `BlockAllocator`: the simulator runs this same code, so its hits, evictions and
prefill saved are real. `check_invariants` checks the three states, the reference counts, the
hash table and the LRU after every step in tests. Lesson 12 teaches it.

Block names use Python's `hash`: fast, and equal for equal prefixes, but not built to resist
crafted collisions. A prompt made to collide with another's would read the other's keys and
values; with API keys the server salts each tenant's chain (`cache_salt`), so only a tenant's
own prompts can collide. A production cache serving strangers would use a cryptographic hash.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict

from minivtc.engine.kv_pool import BlockAllocator

__all__ = ["PrefixCachingAllocator"]


class PrefixCachingAllocator(BlockAllocator):
    caches_prefixes = True

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self.ref_count = [0] * num_blocks
        self.hash_of: dict[int, int] = {}  # block -> its hash, for every cached block
        self.cached: dict[int, int] = {}  # hash -> block: the inverse of hash_of
        self.evictable: OrderedDict[int, None] = OrderedDict()  # unheld cached blocks, LRU first
        self.num_cached: dict[str, int] = {}  # request -> prompt tokens found cached
        self.num_evicted = 0  # cached blocks taken back for other use

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks) + len(self.evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks  # held by requests (cached ones are free)

    def can_allocate_cached(
        self, num_tokens: int, prompt_ids: list[int], salt: str | None = None
    ) -> bool:
        """Would `allocate_cached` succeed? Cached blocks of the prompt are not new ones."""
        hits = self.hits(prompt_ids, salt)
        reused = sum(1 for b in hits if b in self.evictable)  # counted free, but not new
        return self.blocks_needed(num_tokens) - len(hits) <= self.num_free_blocks - reused

    def allocate_cached(
        self, request_id: str, num_tokens: int, prompt_ids: list[int], salt: str | None = None
    ) -> list[int]:
        """Blocks for `num_tokens` positions: the longest cached prefix of `prompt_ids` (among
        blocks cached under the same `salt`) first (`cached_tokens(request_id)` says how many
        tokens it covers), then new blocks."""
        assert request_id not in self.block_tables, f"request {request_id!r} already holds blocks"
        table = self.hits(prompt_ids, salt)
        for b in table:
            self.evictable.pop(b, None)  # held again: no longer evictable
            self.ref_count[b] += 1
        self.num_cached[request_id] = len(table) * self.block_size
        new = self.blocks_needed(num_tokens) - len(table)
        assert new <= self.num_free_blocks, (
            f"request {request_id!r} needs {new} new blocks, only {self.num_free_blocks} free: "
            "callers check can_allocate_cached() first"
        )
        table += [self.take() for _ in range(new)]
        self.block_tables[request_id] = table
        return table

    def allocate(self, request_id: str, num_tokens: int) -> list[int]:
        """New blocks only (no prompt to look up), evicting cached ones when none is free."""
        return self.allocate_cached(request_id, num_tokens, [])

    def grow(self, request_id: str, num_tokens: int) -> None:
        table = self.block_tables[request_id]
        while len(table) * self.block_size < num_tokens:
            assert self.num_free_blocks, (
                f"request {request_id!r} needs another block and none is free: the admission "
                "check should have made this impossible"
            )
            table.append(self.take())

    def free(self, request_id: str) -> None:
        """Release a request's blocks: a cached one nobody else holds becomes evictable (the
        most recently used last), any other unheld one free."""
        assert request_id in self.block_tables, (
            f"double free or unknown request: {request_id!r} holds no blocks"
        )
        self.num_cached.pop(request_id, None)
        for b in reversed(self.block_tables.pop(request_id)):
            self.ref_count[b] -= 1
            if self.ref_count[b]:
                continue
            if b in self.hash_of:
                self.evictable[b] = None
            else:
                self.free_blocks.append(b)

    def cached_tokens(self, request_id: str) -> int:
        """Prompt tokens whose keys and values `allocate_cached` found in the pool."""
        return self.num_cached.get(request_id, 0)

    def named_tokens(self, request_id: str, num_computed: int) -> int:
        """Of the request's first `num_computed` positions, how many lie in blocks the cache
        names (they outlive the request, until evicted)."""
        named = itertools.takewhile(lambda b: b in self.hash_of, self.block_tables[request_id])
        return min(sum(1 for _ in named) * self.block_size, num_computed)

    def cache_prompt(
        self, request_id: str, prompt_ids: list[int], num_computed: int, salt: str | None = None
    ) -> None:
        """Name the request's full prompt blocks whose keys and values are now computed (all
        before the block holding the prompt's last token), so later requests with the same
        `salt` can share them. A block whose hash another block already has stays private."""
        table, bs = self.block_tables[request_id], self.block_size
        shareable = min(num_computed, len(prompt_ids) - 1) // bs
        for i, h in enumerate(self.chain(prompt_ids, shareable, salt)):
            b = table[i]
            if h not in self.cached and b not in self.hash_of:
                self.cached[h], self.hash_of[b] = b, h

    def hits(self, prompt_ids: list[int], salt: str | None = None) -> list[int]:
        """The cached blocks of `prompt_ids`' longest cached prefix (shareable blocks only)."""
        blocks: list[int] = []
        for h in self.chain(prompt_ids, (len(prompt_ids) - 1) // self.block_size, salt):
            b = self.cached.get(h)
            if b is None:
                break
            blocks.append(b)
        return blocks

    def chain(self, prompt_ids: list[int], num_blocks: int, salt: str | None = None) -> list[int]:
        """The hashes of the first `num_blocks` blocks: each of (previous hash, its tokens),
        the first's "previous" being the salt's (requests with other salts never match)."""
        bs, hashes = self.block_size, []
        h = 0 if salt is None else hash(("salt", salt))
        for i in range(num_blocks):
            h = hash((h, tuple(prompt_ids[i * bs : (i + 1) * bs])))
            hashes.append(h)
        return hashes

    def take(self) -> int:
        """A block for new keys and values: a free one, else the least recently used cached
        one, whose hash is forgotten (eviction)."""
        if self.free_blocks:
            b = self.free_blocks.pop()
        else:
            b, _ = self.evictable.popitem(last=False)
            del self.cached[self.hash_of.pop(b)]
            self.num_evicted += 1
        self.ref_count[b] = 1
        return b

    def check_invariants(self) -> None:
        """Every block is held (ref_count = the block tables listing it), evictable (unheld,
        cached) or free (unheld, not cached), exactly one of them; the hash table is a
        bijection over the cached blocks; the LRU holds exactly the unheld cached blocks."""
        holders = [0] * self.num_blocks
        for table in self.block_tables.values():
            assert len(set(table)) == len(table), "a block appears twice in one block table"
            for b in table:
                holders[b] += 1
        assert holders == self.ref_count, "a reference count disagrees with the block tables"
        free, evictable = set(self.free_blocks), set(self.evictable)
        assert len(free) == len(self.free_blocks), "a block is on the free list twice"
        held = {b for b in range(self.num_blocks) if holders[b]}
        assert not free & held and not evictable & held and not free & evictable, (
            "a block is in two of held, evictable and free"
        )
        assert len(free) + len(evictable) + len(held) == self.num_blocks, "a block leaked"
        assert {b: h for h, b in self.cached.items()} == self.hash_of, "hash table not 1:1"
        assert evictable == set(self.hash_of) - held, "the LRU is not the unheld cached blocks"
        assert not free & set(self.hash_of), "a free block still has a hash"
