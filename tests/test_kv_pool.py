"""The block allocator: sizing, block tables and slots, and loud failures on misuse."""

from __future__ import annotations

import pytest
import torch

from minivtc.engine.kv_pool import BlockAllocator, KVPool
from minivtc.model.config import preset


def test_blocks_needed_and_slots():
    alloc = BlockAllocator(num_blocks=8, block_size=4)
    assert [alloc.blocks_needed(n) for n in (1, 4, 5, 8, 9)] == [1, 1, 2, 2, 3]
    table = alloc.allocate("a", 6)
    assert len(table) == 2 and alloc.num_free_blocks == 6
    slots = alloc.slots("a", 0, 6)
    assert slots == [table[p // 4] * 4 + p % 4 for p in range(6)]
    alloc.check_invariants()
    alloc.free("a")
    assert alloc.num_free_blocks == 8
    alloc.check_invariants()


def test_can_allocate_is_exact():
    alloc = BlockAllocator(num_blocks=3, block_size=16)
    assert alloc.can_allocate(48) and not alloc.can_allocate(49)
    alloc.allocate("a", 17)
    assert alloc.can_allocate(16) and not alloc.can_allocate(17)


def test_double_free_is_an_assertion_with_a_message():
    alloc = BlockAllocator(4, 2)
    alloc.allocate("a", 3)
    alloc.free("a")
    with pytest.raises(AssertionError, match="double free"):
        alloc.free("a")


def test_use_after_free_is_an_assertion_with_a_message():
    alloc = BlockAllocator(4, 2)
    alloc.allocate("a", 3)
    alloc.free("a")
    with pytest.raises(AssertionError, match="use after free"):
        alloc.slots("a", 0, 1)


def test_position_beyond_reservation_is_caught():
    alloc = BlockAllocator(4, 2)
    alloc.allocate("a", 3)  # 2 blocks = positions 0..3
    with pytest.raises(AssertionError, match="beyond its 2 blocks"):
        alloc.slots("a", 3, 5)


def test_allocating_twice_or_too_much_is_caught():
    alloc = BlockAllocator(2, 2)
    alloc.allocate("a", 2)
    with pytest.raises(AssertionError, match="already holds blocks"):
        alloc.allocate("a", 1)
    with pytest.raises(AssertionError, match="only 1 free"):
        alloc.allocate("b", 4)


def test_invariants_catch_a_leak_and_a_shared_block():
    alloc = BlockAllocator(4, 1)
    alloc.allocate("a", 2)
    alloc.free_blocks.pop()  # a block vanishes
    with pytest.raises(AssertionError, match="leaked"):
        alloc.check_invariants()
    alloc = BlockAllocator(4, 1)
    alloc.allocate("a", 2)
    alloc.block_tables["b"] = [alloc.block_tables["a"][0]]
    with pytest.raises(AssertionError, match="two requests"):
        alloc.check_invariants()


def test_pool_sizing_from_tokens_and_bytes():
    config = preset("tiny")
    pool = KVPool.from_tokens(config, 10000, block_size=16)
    assert pool.allocator.num_tokens >= 10000 and pool.allocator.num_blocks == 625
    assert pool.k.shape == (config.n_layers, 625, 16, config.n_kv_heads, config.head_dim)
    per_token = config.kv_bytes_per_token(4)
    pool = KVPool.from_bytes(config, 100 * per_token + 5, block_size=1)
    assert pool.allocator.num_blocks == 100 and pool.num_bytes == 100 * per_token
    pool = KVPool.from_tokens(config, 1000, block_size=1, dtype=torch.float16)
    assert pool.k.dtype == torch.float16 and pool.allocator.num_blocks == 1000
    with pytest.raises(ValueError, match="do not hold one block"):
        KVPool.from_bytes(config, 10, block_size=16)
