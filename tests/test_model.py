"""The model against `transformers`' Llama: same logits from the same safetensors checkpoint."""

from __future__ import annotations

import pytest
import torch

from minivtc.model.config import LlamaConfig, preset
from minivtc.model.llama import CausalSequences, Llama, rotary_cos_sin
from minivtc.model.weights import load_model
from tests.conftest import TINY_GQA

transformers = pytest.importorskip("transformers")


def hf_logits(path, ids: torch.Tensor) -> torch.Tensor:
    hf = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(ids).logits  # (B, S, V)


def our_logits(model: Llama, ids: torch.Tensor) -> torch.Tensor:
    b, s = ids.shape
    with torch.no_grad():
        out = model(ids.flatten(), torch.arange(s).repeat(b), CausalSequences([s] * b))
    return out.view(b, s, -1)  # (B, S, V)


def test_logits_match_transformers(hf_checkpoint):
    model, _ = load_model(hf_checkpoint)
    ids = torch.randint(
        0, model.config.vocab_size, (3, 40), generator=torch.Generator().manual_seed(1)
    )
    diff = (our_logits(model, ids) - hf_logits(hf_checkpoint, ids)).abs().max().item()
    assert diff <= 1e-4, f"max |logit diff| = {diff}"


def test_unequal_sequences_match_one_at_a_time(hf_checkpoint):
    """A flat batch of sequences of different lengths == each sequence on its own."""
    model, _ = load_model(hf_checkpoint)
    gen = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, 4096, (n,), generator=gen) for n in (5, 17, 9)]
    lens = [len(s) for s in seqs]
    positions = torch.cat([torch.arange(n) for n in lens])
    with torch.no_grad():
        flat = model(torch.cat(seqs), positions, CausalSequences(lens))
        alone = torch.cat([our_logits(model, s[None])[0] for s in seqs])
    torch.testing.assert_close(flat, alone, atol=1e-5, rtol=1e-5)


def test_logit_rows_select_rows():
    torch.manual_seed(0)
    model = Llama(
        LlamaConfig(vocab_size=50, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=48)
    )
    ids, pos = torch.randint(0, 50, (7,)), torch.arange(7)
    with torch.no_grad():
        full = model(ids, pos, CausalSequences([7]))
        some = model(ids, pos, CausalSequences([7]), logit_rows=torch.tensor([6, 2]))
    torch.testing.assert_close(some, full[[6, 2]])


def test_bundled_model_matches_transformers(bundled):
    from minivtc.model.weights import bundled_weights_dir

    model, tokenizer = bundled
    ids = torch.tensor([tokenizer.encode("The garbage collector is called when")])
    diff = (our_logits(model, ids) - hf_logits(bundled_weights_dir(), ids)).abs().max().item()
    assert diff <= 1e-4, f"max |logit diff| = {diff}"


def test_config_validation_messages():
    with pytest.raises(ValueError, match="not a multiple of n_kv_heads"):
        LlamaConfig(n_heads=6, n_kv_heads=4, dim=96)
    with pytest.raises(ValueError, match="not divisible by n_heads"):
        LlamaConfig(dim=100, n_heads=3, n_kv_heads=3)
    with pytest.raises(KeyError, match="unknown preset"):
        preset("llama-7b")  # presets are exact names: no fuzzy matching


def test_config_round_trips_through_hf():
    for name in ("tiny", "llama-2-7b", "llama-2-70b"):
        assert LlamaConfig.from_hf(preset(name).to_hf()) == preset(name)
    assert preset("llama-2-7b").num_params == pytest.approx(6.74e9, rel=0.01)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_rotary_table_holds_rotary_cos_sin_of_every_position(dtype):
    """`Llama.rotary_tables` reads rows of a table made once: the very values `rotary_cos_sin`
    gives for those positions, cast to the model's dtype."""
    model = Llama(TINY_GQA)
    positions = torch.tensor([0, 5, 1, 200, 5])
    cos, sin = model.rotary_tables(positions, dtype)
    want_cos, want_sin = rotary_cos_sin(positions, TINY_GQA)
    assert torch.equal(cos, want_cos.to(dtype)) and torch.equal(sin, want_sin.to(dtype))
