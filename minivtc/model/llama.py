"""Llama-2 in one file: embedding, RMSNorm, rotary positions, grouped-query attention, SwiGLU.

Owns the forward pass over a *flat* batch of tokens: `tokens` and `positions` are 1-D, and the
tokens of many requests sit side by side. The model never sees requests, clients or policies; it
hands each layer's queries, keys and values to an `attention` object and gets the mixed values
back. Who stores keys and values, and how, is that object's business:

- `CausalSequences` (here): whole sequences with no cache, for training and parity tests;
- `attention.PagedAttention`: the engine's paged KV pool (block tables, slot mapping);
- `attention.ContiguousAttention`: one contiguous cache row per request, the plain baseline.

Does not own: loading weights (`weights.py`), sampling (`sampler.py`). Lesson 1 teaches it.

Shape legend: T tokens in the flat batch, B sequences, S sequence length, E model width (dim),
H query heads, K key/value heads, D head dim, F feed-forward width, V vocabulary, N logit rows.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minivtc.model.config import LlamaConfig

__all__ = ["Attention", "CausalSequences", "DecoderLayer", "Llama", "RMSNorm", "apply_rotary"]
__all__ += ["causal_attention", "rotary_cos_sin"]


class Attention(Protocol):
    """Mixes one layer's values: q (T, H, D), k and v (T, K, D) in, (T, H, D) out."""

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor: ...


class Llama(nn.Module):
    """The Llama-2 decoder. Parameter names follow Hugging Face's, minus the `model.` prefix."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.lm_head = nn.Linear(
            config.dim, config.vocab_size, bias=False
        )  # untied from the embedding
        self._rotary: tuple[Tensor, Tensor] | None = None  # `rotary_tables`' cache

    def forward(
        self,
        tokens: Tensor,
        positions: Tensor,
        attention: Attention,
        logit_rows: Tensor | None = None,
    ) -> Tensor:
        """Logits for the rows `logit_rows` of the flat batch (all rows when None).

        A serving step only needs each request's last position, so the engine passes those rows
        and skips the (T, V) product for every prompt token.
        """
        x = self.embed_tokens(tokens)  # (T, E)
        cos, sin = self.rotary_tables(positions, x.dtype)  # (T, D) each
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, attention, i)  # (T, E)
        if logit_rows is not None:
            x = x[logit_rows]  # (N, E)
        return self.lm_head(self.norm(x))  # (N, V)

    def rotary_tables(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """`rotary_cos_sin(positions)`, cast to `dtype`, read from a table of every position.

        PERF: the table is made once (`rotary_cos_sin` of positions 0..max_positions-1, cast
        once), so a step looks up two rows instead of rebuilding them from the frequencies and
        casting them in every layer; the values are the same ones (what it measured:
        `minivtc/bench/README.md`)."""
        table = self._rotary
        if table is None or (table[0].device, table[0].dtype) != (positions.device, dtype):
            every = torch.arange(self.config.max_positions, device=positions.device)
            cos, sin = rotary_cos_sin(every, self.config)  # (P, D) each, float32
            self._rotary = table = cos.to(dtype), sin.to(dtype)
        cos, sin = table
        return cos[positions], sin[positions]  # (T, D) each


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.self_attn = SelfAttention(config)
        self.post_attention_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.mlp = SwiGLU(config.dim, config.ffn_dim)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attention: Attention, i: int) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attention, i)  # (T, E)
        return x + self.mlp(self.post_attention_layernorm(x))  # (T, E)


class SelfAttention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        h, k, d = config.n_heads, config.n_kv_heads, config.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = h, k, d
        self.q_proj = nn.Linear(config.dim, h * d, bias=False)
        self.k_proj = nn.Linear(config.dim, k * d, bias=False)
        self.v_proj = nn.Linear(config.dim, k * d, bias=False)
        self.o_proj = nn.Linear(h * d, config.dim, bias=False)
        self.qkv_proj: nn.Module | None = None  # q, k, v in one product (`packed.py` sets it)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attention: Attention, i: int) -> Tensor:
        t = x.shape[0]
        if self.qkv_proj is None:  # the plain path: three products
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # (T, H*D), (T, K*D) x2
            q = q.reshape(t, self.n_heads, self.head_dim)  # (T, H, D)
            k = k.reshape(t, self.n_kv_heads, self.head_dim)  # (T, K, D)
            v = v.reshape(t, self.n_kv_heads, self.head_dim)  # (T, K, D)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)  # (T, H, D), (T, K, D)
        else:  # one product of the three weights stacked, cut into heads: H of q, K of k, K of v
            h, kv = self.n_heads, self.n_kv_heads
            qkv = self.qkv_proj(x).view(t, h + 2 * kv, self.head_dim)  # (T, H+2K, D)
            # q's heads and k's lie side by side: one rotation turns both (half the calls)
            qk = apply_rotary(qkv[:, : h + kv], cos, sin)  # (T, H+K, D)
            q, k = torch.split(qk, [h, kv], dim=1)  # (T, H, D), (T, K, D)
            v = qkv[:, h + kv :]  # (T, K, D)
        out = attention(i, q, k, v)  # (T, H, D)
        return self.o_proj(out.reshape(t, self.n_heads * self.head_dim))  # (T, E)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, ffn_dim: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.up_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.down_proj = nn.Linear(ffn_dim, dim, bias=False)
        self.gate_up_proj: nn.Module | None = None  # gate and up in one product (`packed.py`)

    def forward(self, x: Tensor) -> Tensor:
        if self.gate_up_proj is None:  # the plain path: two products
            gate, up = self.gate_proj(x), self.up_proj(x)  # (T, F) each
        else:
            gate, up = self.gate_up_proj(x).chunk(2, -1)  # (T, 2F) cut in two
        return self.down_proj(F.silu(gate) * up)  # (T, F) -> (T, E)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """x / sqrt(mean(x^2) + eps) * weight, over the last dimension."""
        # Normalise in fp32 even for a bf16/fp16 model: the mean of squares overflows in fp16.
        x32 = x.float()  # (T, E)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)  # (T, E)
        return self.weight * x32.to(x.dtype)  # (T, E)


def rotary_cos_sin(positions: Tensor, config: LlamaConfig) -> tuple[Tensor, Tensor]:
    """RoPE tables for the given positions (T,): cos and sin, each (T, head_dim), in float32
    on the positions' device, whatever the model's dtype (`apply_rotary` casts them to the
    dtype of the tensor it rotates).

    Hugging Face's layout: frequencies for the first and the second half of each head are the
    same (`rotate_half` below), which is how Llama-2's published weights are permuted.
    """
    d = config.head_dim
    inv_freq = 1.0 / config.rope_theta ** (
        torch.arange(0, d, 2, dtype=torch.float32, device=positions.device) / d
    )  # (D/2,)
    angles = positions.float()[:, None] * inv_freq[None, :]  # (T, D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, D)
    return angles.cos(), angles.sin()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each head of x (T, heads, D) by its position's angles (`rotary_cos_sin`)."""
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)  # (T, 1, D)
    return x * cos + rotate_half(x) * sin  # (T, heads, D)


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # (T, heads, D)


class CausalSequences:
    """Attention over whole sequences laid end to end, with no KV cache.

    For training and for checking the model against `transformers`: the flat batch holds
    complete sequences of lengths `seq_lens`, and each token attends to the earlier tokens of its
    own sequence. Sequences of equal length are run as one (B, H, S, D) product.
    """

    def __init__(self, seq_lens: list[int]) -> None:
        self.seq_lens = seq_lens

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if len(set(self.seq_lens)) == 1:
            return causal_attention(q, k, v, len(self.seq_lens))
        outs = [
            causal_attention(qs, ks, vs, 1)
            for qs, ks, vs in zip(
                torch.split(q, self.seq_lens),
                torch.split(k, self.seq_lens),
                torch.split(v, self.seq_lens),
                strict=True,
            )
        ]
        return torch.cat(outs)  # (T, H, D)


def causal_attention(q: Tensor, k: Tensor, v: Tensor, batch: int) -> Tensor:
    """Causal attention over `batch` equal-length sequences stored flat: (T, H, D) out."""
    t, h, d = q.shape
    s = t // batch
    q = q.view(batch, s, h, d).transpose(1, 2)  # (B, H, S, D)
    k = k.view(batch, s, -1, d).transpose(1, 2)  # (B, K, S, D)
    v = v.view(batch, s, -1, d).transpose(1, 2)  # (B, K, S, D)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # (B, H, S, D)
    return out.transpose(1, 2).reshape(t, h, d)  # (T, H, D)
