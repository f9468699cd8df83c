"""Paged attention == dense causal attention, through shuffled block tables and mixed batches."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from minivtc.core.attention import ContiguousAttention, PagedAttention
from minivtc.core.kv_pool import BlockAllocator
from minivtc.core.request import Request
from minivtc.core.runner import build_group
from minivtc.core.sampler import SamplingParams

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
