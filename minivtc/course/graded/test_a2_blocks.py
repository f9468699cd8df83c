"""Assignment a2: the block allocator and the slot mapping (Lesson 2).

Graded by the allocator's own invariants after every operation and by paged attention giving
the tokens of dense attention."""

from __future__ import annotations

import random

import pytest
import torch

from minivtc.engine.factory import build_engine
from minivtc.engine.generate import generate_plain
from minivtc.engine.kv_pool import BlockAllocator
from minivtc.model.config import LlamaConfig
from minivtc.model.llama import Llama
from minivtc.requests.params import SamplingParams

__all__ = []


def test_allocate_grow_free_and_slots():
    """allocate, grow, free and slots on one request: exactly the blocks needed, and the slots they
    give."""
    a = BlockAllocator(num_blocks=6, block_size=4)
    table = a.allocate("r", 6)  # 6 positions: 2 blocks
    assert table == a.block_tables["r"], f"allocate returned {table}, not the block table"
    assert len(a.block_tables["r"]) == 2 and a.num_free_blocks == 4, (
        f"allocate('r', 6) with blocks of 4: table {a.block_tables['r']} and "
        f"{a.num_free_blocks} free blocks, not 2 blocks taken and 4 of 6 left free "
        "(BlockAllocator.allocate: ceil(6 / 4) blocks, removed from the free list)"
    )
    blocks = list(a.block_tables["r"])
    expected = [blocks[p // 4] * 4 + p % 4 for p in range(6)]
    assert a.slots("r", 0, 6) == expected, (
        f"slots('r', 0, 6) with table {blocks}: {a.slots('r', 0, 6)}, not {expected} "
        "(BlockAllocator.slots: position p is slot table[p // block_size] * block_size + "
        "p % block_size)"
    )
    a.grow("r", 9)  # 9 positions: 3 blocks
    assert len(a.block_tables["r"]) == 3 and a.block_tables["r"][:2] == blocks, (
        f"grow('r', 9) from table {blocks}: {a.block_tables['r']}, not those 2 blocks and one "
        "more (BlockAllocator.grow appends the blocks missing for 9 positions, keeps the rest)"
    )
    a.grow("r", 9)  # already there: nothing more
    assert a.num_free_blocks == 3, (
        f"grow('r', 9) again: {a.num_free_blocks} blocks free, not 3 (a table that already "
        "covers the positions takes nothing more)"
    )
    a.grow("r", 12)  # exactly 3 blocks of 4: nothing more
    assert len(a.block_tables["r"]) == 3, (
        f"12 positions fill 3 blocks of 4 exactly: grow took {len(a.block_tables['r'])}"
    )
    a.free("r")
    assert a.num_free_blocks == 6 and "r" not in a.block_tables, (
        f"after free('r'): {a.num_free_blocks} of 6 blocks free, table kept: "
        f"{'r' in a.block_tables} (BlockAllocator.free returns every block and drops the table)"
    )
    a.allocate("s", 1)
    a.grow("s", 17)  # 1 block to 5 at once
    assert len(a.block_tables["s"]) == 5, (
        f"growing from 1 position to 17 needs 5 blocks of 4; the table has "
        f"{len(a.block_tables['s'])}"
    )
    a.check_invariants()


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_random_operations_keep_the_invariants(block_size):
    """Random allocate / grow / free keep the allocator's invariants, exactly the blocks needed and
    distinct slots."""
    rng = random.Random(block_size)
    a, held = BlockAllocator(40, block_size), {}
    for i in range(400):
        op = rng.random()
        if op < 0.45:
            n = rng.randint(1, 3 * block_size)
            if a.can_allocate(n):
                a.allocate(f"r{i}", n)
                held[f"r{i}"] = n
        elif op < 0.75 and held:
            r = rng.choice(sorted(held))
            n = held[r] + rng.randint(0, block_size)
            if a.blocks_needed(n) - len(a.block_tables[r]) <= a.num_free_blocks:
                a.grow(r, n)
                held[r] = max(held[r], n)
        elif held:
            r = rng.choice(sorted(held))
            a.free(r)
            del held[r]
        a.check_invariants()
        for r, n in held.items():
            assert len(a.block_tables[r]) == a.blocks_needed(n), (
                f"{r} holds {len(a.block_tables[r])} blocks for {n} positions of "
                f"{block_size}: exactly {a.blocks_needed(n)} are needed"
            )
            slots = a.slots(r, 0, n)
            assert len(set(slots)) == n, (
                f"{r}'s {n} positions map to {len(set(slots))} distinct slots: two positions "
                "share a cell (BlockAllocator.slots)"
            )
            assert all(s // block_size in a.block_tables[r] for s in slots), (
                f"a slot of {r} lies in a block it does not hold: slots {slots}, table "
                f"{a.block_tables[r]} (BlockAllocator.slots)"
            )


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_paged_engine_gives_the_tokens_of_dense_attention(block_size):
    """The paged engine gives the tokens of dense attention (the slots put K/V where attention reads
    them)."""
    torch.manual_seed(0)
    model = Llama(
        LlamaConfig(
            vocab_size=256,
            dim=32,
            n_layers=2,
            n_heads=4,
            n_kv_heads=2,
            ffn_dim=48,
            max_positions=128,
        )
    ).eval()
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    engine = build_engine(model, None, kv_tokens=300, block_size=block_size, check_invariants=True)
    prompts = [[3 + i, 40 + 2 * i, 7, 90 + i][: 2 + i % 3] for i in range(5)]
    requests = [engine.add_request(p, params) for p in prompts]
    while engine.has_unfinished():
        engine.step()
    for p, r in zip(prompts, requests, strict=True):
        dense = list(generate_plain(model, p, params))
        assert r.output_ids == dense, (
            f"block size {block_size}, prompt {p}: paged attention gave {r.output_ids}, dense "
            f"attention {dense}: the slot mapping puts a token's K/V where attention does not "
            "read it (BlockAllocator.slots, or the blocks grow gave)"
        )
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks, (
        f"every request finished but {engine.allocator.num_used_blocks} blocks are still held "
        "(BlockAllocator.free)"
    )
