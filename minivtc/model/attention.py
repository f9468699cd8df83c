"""Attention over cached keys and values: the paged path the engine uses, and a contiguous one.

Owns the two `model.Attention` implementations that keep a KV cache:

- `PagedAttention`: keys and values live in the `KVPool`'s blocks. New keys/values are written
  through a *slot mapping* (token -> slot = block * block_size + offset); each request's history
  is read back through its *block table* (a gather), masked, and fed to
  `scaled_dot_product_attention`. One step may mix requests prefilling many tokens with requests
  decoding one: they are run as two groups, so a 1-token decode is never padded to a long prompt.
- `ContiguousAttention`: one preallocated cache row per sequence (what `transformers` and most
  first implementations do). The plain generation path and the paging benchmark use it.

`attend_group` is the one function that does the arithmetic (gather, mask, SDPA);
`compile_attention=True` runs it through `torch.compile` with bucketed shapes (rows, queries and
block-table width rounded up to powers of two), so a server sees a few dozen shapes, not one per
step. Does not own: which blocks a request holds (`kv_pool.py`) or which requests run
(`engine.py`). Lesson 2 teaches it.

Shape legend: T tokens in the flat batch, R requests in a group, Q padded queries per request,
L keys per request (blocks * block_size), NB blocks per row, BS block size, H query heads,
K key/value heads, D head dim, S slots in the pool (num_blocks * block_size).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["AttentionGroup", "ContiguousAttention", "PagedAttention", "attend_group"]
__all__ += ["visibility_mask"]


@dataclass
class AttentionGroup:
    """The requests of one group (all prefilling, or all decoding) and where their tokens sit.

    `token_rows` (R, Q) gives, for each request and each of its new tokens, the row in the flat
    batch (padding repeats a valid row, and `query_positions` of padding is 0, so padded queries
    see one key and never divide by zero). `out_index` (Tg,) picks the real rows back out.
    """

    start: int  # first row of this group in the flat batch
    end: int  # one past its last row
    token_rows: Tensor  # (R, Q) rows of the flat batch, relative to `start`
    query_positions: Tensor  # (R, Q) position of each query; keys at positions <= it are visible
    block_tables: Tensor  # (R, NB) block ids, padded with 0 (masked: beyond every query position)
    out_index: Tensor  # (Tg,) index into the flattened (R*Q) outputs, in flat-batch order
    # No padding (every request brings Q new tokens, no bucketing rows): token_rows is the flat
    # batch's rows in order and out_index every output, so both gathers can be skipped.
    dense: bool = False


def attend_group(
    q: Tensor,  # (R, Q, H, D) each request's new queries, padded to Q
    k_cache: Tensor,  # (num_blocks, BS, K, D) one layer of the pool
    v_cache: Tensor,  # (num_blocks, BS, K, D)
    query_positions: Tensor,  # (R, Q)
    block_tables: Tensor,  # (R, NB)
    mask: Tensor | None = None,  # (R, 1, Q, L) `visibility_mask`, if the caller made it already
) -> Tensor:
    """Paged attention for one group: gather each request's keys by block table, mask, SDPA."""
    r, n_q, n_heads, _ = q.shape
    _, _, n_kv, d = k_cache.shape
    # PERF: index_select, not k_cache[block_tables]: the same gather, faster on CPU (bench README)
    blocks = block_tables.flatten()  # (R*NB,)
    k = k_cache.index_select(0, blocks).view(r, -1, n_kv, d).transpose(1, 2)  # (R, K, L, D)
    v = v_cache.index_select(0, blocks).view(r, -1, n_kv, d).transpose(1, 2)  # (R, K, L, D)
    if mask is None:
        mask = visibility_mask(query_positions, k.shape[2], q.dtype)  # (R, 1, Q, L)
    if n_q == 1:
        # Decoding: the G query heads that share a KV head are G queries of that head, and
        # (R, 1, H, D) -> (R, K, G, D) is a view (query head h reads KV head h // G, as in
        # `transformers`' repeat_kv). PERF: enable_gqa copies each key and value G times on
        # CPU; this reads them once (what it measured: minivtc/bench/README.md).
        out = F.scaled_dot_product_attention(q.view(r, n_kv, -1, d), k, v, attn_mask=mask)
        return out.reshape(r, 1, n_heads, d)  # (R, K, G, D) -> (R, Q, H, D)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k, v, attn_mask=mask, enable_gqa=True
    )  # (R, H, Q, D)
    return out.transpose(1, 2)  # (R, Q, H, D)


def visibility_mask(query_positions: Tensor, n_keys: int, dtype: torch.dtype) -> Tensor:
    """(R, 1, Q, L) additive mask: 0 where a query may see a key, -inf where it may not.

    A key is visible if it is not in the query's future. Keys past a request's context are in
    the future of all its queries, so this one comparison also hides padding and stale slots.
    """
    key_positions = torch.arange(n_keys, device=query_positions.device)  # (L,)
    visible = key_positions[None, None, :] <= query_positions[:, :, None]  # (R, Q, L)
    # Additive, not boolean: SDPA turns a boolean mask into exactly this one on every call.
    hidden = torch.zeros(visible.shape, dtype=dtype, device=visible.device)  # (R, Q, L)
    return hidden.masked_fill_(~visible, float("-inf"))[:, None]  # (R, 1, Q, L)


class PagedAttention:
    """`model.Attention` over a KV pool for one step, described by `slot_mapping` and groups."""

    def __init__(
        self,
        k_cache: Tensor,  # (n_layers, num_blocks, BS, K, D)
        v_cache: Tensor,  # (n_layers, num_blocks, BS, K, D)
        slot_mapping: Tensor,  # (T,) where each new token's key and value are written
        groups: list[AttentionGroup],
        attend: Callable[..., Tensor] = attend_group,
    ) -> None:
        self.k_cache, self.v_cache = k_cache, v_cache
        self.slot_mapping = slot_mapping
        self.groups = groups
        self.attend = attend
        # PERF: the mask is the same in every layer: made once per step, not once per layer
        # (what it measured: minivtc/bench/README.md)
        block_size = k_cache.shape[2]
        self.masks = [
            visibility_mask(g.query_positions, g.block_tables.shape[1] * block_size, k_cache.dtype)
            for g in groups
        ]  # (R, 1, Q, L) per group

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        k_layer, v_layer = self.k_cache[layer], self.v_cache[layer]  # (num_blocks, BS, K, D)
        n_kv, d = k.shape[1], k.shape[2]
        k_layer.view(-1, n_kv, d).index_copy_(0, self.slot_mapping, k)  # (S, K, D) <- (T, K, D)
        v_layer.view(-1, n_kv, d).index_copy_(0, self.slot_mapping, v)
        outs = []
        for g, mask in zip(self.groups, self.masks, strict=True):
            qg = q[g.start : g.end]  # (Tg, H, D)
            if not g.dense:  # padded: each request's queries gathered into its row of Q
                qg = qg.index_select(0, g.token_rows.flatten())  # (R*Q, H, D)
            qp = qg.view(*g.token_rows.shape, *q.shape[1:])  # (R, Q, H, D)
            out = self.attend(
                qp, k_layer, v_layer, g.query_positions, g.block_tables, mask
            ).flatten(0, 1)  # (R*Q, H, D)
            outs.append(out if g.dense else out.index_select(0, g.out_index))  # (Tg, H, D)
        return outs[0] if len(outs) == 1 else torch.cat(outs)  # (T, H, D)


class ContiguousAttention:
    """A plain KV cache: row `i` holds sequence `i`'s keys at positions 0..max_len-1.

    For a step, `rows` names the cache row of each token of the flat batch and `positions` its
    position; all sequences in a step must feed the same number of tokens (the plain path runs
    one prompt, or one token per sequence), so queries reshape to (R, Q, H, D) with no gather.
    """

    def __init__(
        self,
        n_layers: int,
        n_rows: int,
        max_len: int,
        n_kv: int,
        d: int,
        dtype: torch.dtype,
        device: str | torch.device,
    ) -> None:
        shape = (n_layers, n_rows, max_len, n_kv, d)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (layers, R, L, K, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.rows = torch.zeros(0, dtype=torch.long)
        self.positions = torch.zeros(0, dtype=torch.long)

    def set_step(self, rows: Tensor, positions: Tensor) -> None:
        self.rows, self.positions = rows, positions  # (T,), (T,)

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        self.k[layer, self.rows, self.positions] = k  # (T, K, D)
        self.v[layer, self.rows, self.positions] = v
        n_rows = int(self.rows.max()) + 1
        t, h, d = q.shape
        nq = t // n_rows
        length = int(self.positions.max()) + 1
        keys = self.k[layer, :n_rows, :length].transpose(1, 2)  # (R, K, L, D), a view: no copy
        values = self.v[layer, :n_rows, :length].transpose(1, 2)  # (R, K, L, D)
        qp = q.view(n_rows, nq, h, d).transpose(1, 2)  # (R, H, Q, D)
        query_positions = self.positions.view(n_rows, nq)  # (R, Q)
        visible = (
            torch.arange(length, device=q.device)[None, None, :] <= query_positions[:, :, None]
        )  # (R, Q, L)
        out = F.scaled_dot_product_attention(
            qp, keys, values, attn_mask=visible[:, None], enable_gqa=True
        )  # (R, H, Q, D)
        return out.transpose(1, 2).reshape(t, h, d)  # (T, H, D)
