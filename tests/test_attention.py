"""Paged attention == dense causal attention, through shuffled block tables and mixed batches."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
import torch.nn.functional as F

from minivtc.engine.kv_pool import BlockAllocator
from minivtc.engine.runner import build_group
from minivtc.engine.sampler import SamplingParams
from minivtc.model.attention import (
    ContiguousAttention,
    PagedAttention,
    attend_group,
    visibility_mask,
)
from minivtc.requests.request import Request

H, K, D = 4, 2, 8  # grouped-query: 2 query heads per KV head


def dense_reference(q, k, v, start):
    """Queries at positions start.. attend causally to keys 0..: (n, H, D)."""
    n, length = q.shape[0], k.shape[0]
    visible = torch.arange(length)[None, :] <= (start + torch.arange(n))[:, None]  # (n, L)
    return F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1),
        v.transpose(0, 1),
        attn_mask=visible,
        enable_gqa=True,
    ).transpose(0, 1)


def run_paged(specs, block_size, bucketed=False, seed=0):
    """specs: (history_len, new_len) per request. Returns (paged, dense) outputs, flat."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-(h + n) // block_size) for h, n in specs) + 3
    alloc = BlockAllocator(num_blocks, block_size)
    random.Random(seed).shuffle(alloc.free_blocks)  # non-contiguous block tables
    k_cache = torch.randn(1, num_blocks, block_size, K, D, generator=gen)  # garbage in free slots
    v_cache = torch.randn(1, num_blocks, block_size, K, D, generator=gen)
    requests, qs, ks, vs, dense = [], [], [], [], []
    for i, (hist, new) in enumerate(specs):
        r = Request(f"r{i}", "c", list(range(hist + new)), SamplingParams(max_tokens=1), 0.0)
        r.num_computed = hist
        alloc.allocate(r.request_id, hist + new)
        k, v = (
            torch.randn(hist + new, K, D, generator=gen),
            torch.randn(hist + new, K, D, generator=gen),
        )
        q = torch.randn(new, H, D, generator=gen)
        hist_slots = torch.tensor(alloc.slots(r.request_id, 0, hist), dtype=torch.long)
        k_cache[0].view(-1, K, D)[hist_slots] = k[:hist]
        v_cache[0].view(-1, K, D)[hist_slots] = v[:hist]
        requests.append(r)
        qs.append(q), ks.append(k[hist:]), vs.append(v[hist:])
        dense.append(dense_reference(q, k, v, hist))
    prefill = [r for r in requests if r.num_tokens - r.num_computed > 1]
    decode = [r for r in requests if r.num_tokens - r.num_computed == 1]
    order = {r.request_id: i for i, r in enumerate(requests)}
    groups, start = [], 0
    for g in (prefill, decode):
        if g:
            groups.append(build_group(g, start, alloc, bucketed, "cpu"))
            start = groups[-1].end
    ordered = [order[r.request_id] for r in prefill + decode]
    slots = [s for i in ordered for s in alloc.slots(f"r{i}", specs[i][0], sum(specs[i]))]
    attention = PagedAttention(k_cache, v_cache, torch.tensor(slots), groups)
    out = attention(
        0,
        torch.cat([qs[i] for i in ordered]),
        torch.cat([ks[i] for i in ordered]),
        torch.cat([vs[i] for i in ordered]),
    )
    return out, torch.cat([dense[i] for i in ordered])


MIXED = [(0, 7), (5, 1), (33, 1), (0, 1), (16, 16), (2, 30), (40, 1)]


@pytest.mark.parametrize("block_size", [1, 16, 5])
@pytest.mark.parametrize("bucketed", [False, True])
def test_paged_equals_dense_mixed_batch(block_size, bucketed):
    paged, dense = run_paged(MIXED, block_size, bucketed)
    torch.testing.assert_close(paged, dense, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(5))
def test_paged_equals_dense_random(seed):
    rng = random.Random(seed)
    specs = [
        (rng.randint(0, 60), rng.choice([1, 1, rng.randint(1, 40)]))
        for _ in range(rng.randint(1, 9))
    ]
    paged, dense = run_paged(specs, block_size=rng.choice([1, 2, 16]), seed=seed)
    torch.testing.assert_close(paged, dense, atol=1e-5, rtol=1e-5)


def paged_group(n_rows, n_q, seed):
    """A random group: queries (R, Q, H, D), a shuffled pool, block tables, query positions."""
    gen = torch.Generator().manual_seed(seed)
    block_size, blocks_per_row = 4, 5
    num_blocks = n_rows * blocks_per_row
    q = torch.randn(n_rows, n_q, H, D, generator=gen)
    k_cache = torch.randn(num_blocks, block_size, K, D, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, K, D, generator=gen)
    tables = torch.randperm(num_blocks, generator=gen).view(n_rows, blocks_per_row)
    last = torch.randint(n_q - 1, num_blocks // n_rows * block_size, (n_rows, 1), generator=gen)
    return q, k_cache, v_cache, last - n_q + 1 + torch.arange(n_q), tables


def grouped_query_reference(q, k_cache, v_cache, query_positions, tables):
    """SDPA's own grouped-query path (enable_gqa) with a boolean mask: (R, Q, H, D)."""
    n_rows = q.shape[0]
    k = k_cache[tables].flatten(1, 2).transpose(1, 2)  # (R, K, L, D)
    v = v_cache[tables].flatten(1, 2).transpose(1, 2)
    visible = torch.arange(k.shape[2])[None, None, :] <= query_positions[:, :, None]
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k, v, attn_mask=visible[:, None], enable_gqa=True
    )
    return out.transpose(1, 2).reshape(n_rows, q.shape[1], H, D)


@pytest.mark.parametrize("seed", range(3))
def test_decode_attention_equals_sdpa_grouped_query_path(seed):
    """Decoding folds each KV head's query heads into queries of that head: the same numbers
    as SDPA's enable_gqa (to float rounding: the kernels sum in another order)."""
    group = paged_group(n_rows=6, n_q=1, seed=seed)
    got = attend_group(*group)
    torch.testing.assert_close(got, grouped_query_reference(*group), atol=1e-6, rtol=1e-5)


def test_prefill_attention_and_a_precomputed_mask_are_exact():
    """The additive mask is the one SDPA makes of a boolean mask: prefill gives SDPA's exact
    numbers, whether attend_group makes the mask or is handed it (once per step)."""
    q, k_cache, v_cache, positions, tables = paged_group(n_rows=3, n_q=7, seed=0)
    expected = grouped_query_reference(q, k_cache, v_cache, positions, tables)
    mask = visibility_mask(positions, tables.shape[1] * k_cache.shape[1], q.dtype)
    assert torch.equal(attend_group(q, k_cache, v_cache, positions, tables), expected)
    assert torch.equal(attend_group(q, k_cache, v_cache, positions, tables, mask), expected)


def test_contiguous_equals_dense():
    gen = torch.Generator().manual_seed(3)
    n, steps = 3, 6
    cache = ContiguousAttention(1, n, 20, K, D, torch.float32, "cpu")
    q = torch.randn(n, 10, H, D, generator=gen)
    k = torch.randn(n, 10, K, D, generator=gen)
    v = torch.randn(n, 10, K, D, generator=gen)
    rows = torch.arange(n).repeat_interleave(4)
    cache.set_step(rows, torch.arange(4).repeat(n))
    outs = [
        cache(0, q[:, :4].flatten(0, 1), k[:, :4].flatten(0, 1), v[:, :4].flatten(0, 1)).view(
            n, 4, H, D
        )
    ]
    for p in range(4, steps + 4):
        cache.set_step(torch.arange(n), torch.full((n,), p))
        outs.append(cache(0, q[:, p], k[:, p], v[:, p]).view(n, 1, H, D))
    got = torch.cat(outs, dim=1)
    for i in range(n):
        torch.testing.assert_close(
            got[i], dense_reference(q[i], k[i], v[i], 0), atol=1e-5, rtol=1e-5
        )


@pytest.mark.parametrize("specs", [[(5, 1), (33, 1), (0, 1)], [(0, 7)], [(2, 7), (9, 7)]])
def test_an_unpadded_group_skips_its_gathers_and_gets_the_same_numbers(specs):
    """A group whose requests all bring the same number of new tokens (a decode step, one
    prompt) is marked dense and skips the row gathers; a padded one is not; forcing the gathers
    on a dense group changes no number."""
    block_size = 4
    alloc = BlockAllocator(64, block_size)
    requests = []
    for i, (hist, new) in enumerate(specs):
        r = Request(f"r{i}", "c", list(range(hist + new)), SamplingParams(max_tokens=1), 0.0)
        r.num_computed = hist
        alloc.allocate(r.request_id, hist + new)
        requests.append(r)
    group = build_group(requests, 0, alloc, False, "cpu")
    assert group.dense
    assert not build_group(requests, 0, alloc, True, "cpu").dense or len(specs) == 1
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache = torch.randn(2, 1, 64, block_size, K, D, generator=gen)
    t = sum(new for _, new in specs)
    slots = torch.tensor(
        [
            s
            for r, (h, n) in zip(requests, specs, strict=True)
            for s in alloc.slots(r.request_id, h, h + n)
        ]
    )
    q, k, v = torch.randn(t, H, D, generator=gen), *torch.randn(2, t, K, D, generator=gen)
    fast = PagedAttention(k_cache.clone(), v_cache.clone(), slots, [group])(0, q, k, v)
    padded_path = dataclasses.replace(group, dense=False)
    slow = PagedAttention(k_cache.clone(), v_cache.clone(), slots, [padded_path])(0, q, k, v)
    assert torch.equal(fast, slow)


def test_a_group_with_unequal_new_tokens_is_padded_not_dense():
    alloc = BlockAllocator(16, 4)
    requests = []
    for i, (hist, new) in enumerate([(0, 7), (3, 2)]):
        r = Request(f"r{i}", "c", list(range(hist + new)), SamplingParams(max_tokens=1), 0.0)
        r.num_computed = hist
        alloc.allocate(r.request_id, hist + new)
        requests.append(r)
    assert not build_group(requests, 0, alloc, False, "cpu").dense
