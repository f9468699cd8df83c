"""Assignment a1: RMSNorm, rotary positions, grouped-query causal attention (Lesson 1).

Graded against `transformers`' Llama, piece by piece, then the whole model's logits."""

from __future__ import annotations

import shutil

import pytest
import torch

from minivtc.model.config import LlamaConfig
from minivtc.model.llama import (
    CausalSequences,
    RMSNorm,
    apply_rotary,
    causal_attention,
    rotary_cos_sin,
)
from minivtc.model.weights import BUNDLED_WEIGHTS, load_model

__all__ = []

transformers = pytest.importorskip("transformers")
from transformers.models.llama import modeling_llama as hf  # noqa: E402

GQA = LlamaConfig(
    vocab_size=4096,
    dim=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    ffn_dim=96,
    max_positions=256,
    rope_theta=500000.0,
)
MHA = LlamaConfig(
    vocab_size=4096,
    dim=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=4,
    ffn_dim=96,
    max_positions=256,
    rope_theta=10000.0,
)


def hf_config(config: LlamaConfig):
    return transformers.LlamaConfig(
        **{k: v for k, v in config.to_hf().items() if k != "architectures"}
    )


def test_rmsnorm_matches_transformers():
    """RMSNorm matches transformers' LlamaRMSNorm, on large inputs and on small ones (where eps
    matters)."""
    torch.manual_seed(0)
    ours, theirs = RMSNorm(64, 1e-5), hf.LlamaRMSNorm(64, eps=1e-5)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        theirs.weight.copy_(ours.weight)
    x = torch.randn(7, 64) * 3
    torch.testing.assert_close(ours(x), theirs(x))
    tiny = torch.randn(7, 64) * 1e-3  # here eps matters: mean(x^2) ~ 1e-6 < eps
    torch.testing.assert_close(ours(tiny), theirs(tiny), msg="RMSNorm of small inputs (eps)")


@pytest.mark.parametrize("config", [MHA, GQA], ids=["theta 1e4", "theta 5e5"])
def test_rotary_positions_match_transformers(config):
    """RoPE's cos/sin tables and rotation match transformers' (the halves layout, the configured
    theta)."""
    torch.manual_seed(1)
    positions = torch.tensor([0, 1, 2, 7, 30, 31])
    q = torch.randn(len(positions), config.n_heads, config.head_dim)  # (T, H, D)
    cos, sin = rotary_cos_sin(positions, config)
    rotary = hf.LlamaRotaryEmbedding(config=hf_config(config))
    hf_cos, hf_sin = rotary(q, positions[None])  # (1, T, D)
    theirs, _ = hf.apply_rotary_pos_emb(
        q.transpose(0, 1)[None], q.transpose(0, 1)[None], hf_cos, hf_sin
    )
    torch.testing.assert_close(apply_rotary(q, cos, sin), theirs[0].transpose(0, 1))


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_causal_attention_with_grouped_queries(heads, kv_heads):
    """Causal attention with grouped queries: query head h reads K/V head h // (H / K), and
    each token the earlier tokens of its own sequence only (two sequences laid end to end)."""
    torch.manual_seed(2)
    s, d = 5, 8
    q, k, v = (
        torch.randn(2 * s, heads, d),
        torch.randn(2 * s, kv_heads, d),
        torch.randn(2 * s, kv_heads, d),
    )
    expected = []
    for seq in range(2):
        rows = slice(seq * s, (seq + 1) * s)
        kk = k[rows].repeat_interleave(heads // kv_heads, dim=1)  # (S, H, D)
        vv = v[rows].repeat_interleave(heads // kv_heads, dim=1)  # (S, H, D)
        scores = torch.einsum("shd,thd->hst", q[rows], kk) / d**0.5  # (H, S, S)
        scores = scores.masked_fill(torch.ones(s, s).triu(1).bool(), float("-inf"))
        expected.append(torch.einsum("hst,thd->shd", scores.softmax(-1), vv))  # (S, H, D)
    torch.testing.assert_close(causal_attention(q, k, v, 2), torch.cat(expected))


@pytest.mark.parametrize("config", [MHA, GQA], ids=["mha", "gqa"])
def test_whole_model_logits_match_transformers(config, tmp_path):
    """The whole model's logits match transformers' Llama with the same weights."""
    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(hf_config(config)).eval()
    model.save_pretrained(tmp_path, safe_serialization=True)
    shutil.copy(BUNDLED_WEIGHTS / "tokenizer.model", tmp_path / "tokenizer.model")
    ours, _ = load_model(tmp_path)
    ids = torch.randint(0, config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        theirs = model(ids).logits  # (B, S, V)
        mine = ours(ids.flatten(), torch.arange(24).repeat(2), CausalSequences([24, 24]))
    error = (mine.view(2, 24, -1) - theirs).abs().max().item()
    assert error <= 1e-4, (
        f"the whole model's logits differ from transformers' Llama by up to {error:.2e} (> 1e-4) "
        "though each piece's test may pass: check the pieces' layouts together (RoPE halves, "
        "the grouped K/V heads, attention within each sequence only)"
    )
