"""The packed linear layers (`model/packed.py`) against the plain `nn.Linear` path they replace:
the same logits to float rounding, the same greedy tokens from the engine."""

import pytest
import torch

from minivtc.engine.factory import build_engine
from minivtc.model.llama import CausalSequences
from minivtc.model.packed import PackedLinear, can_pack
from minivtc.model.weights import load_model
from minivtc.requests.params import SamplingParams

pytestmark = pytest.mark.skipif(not can_pack(), reason="this PyTorch build has no oneDNN")


def logits(model, ids, lens):
    positions = torch.cat([torch.arange(n) for n in lens])
    return model(ids, positions, CausalSequences(lens)).float()


@pytest.mark.parametrize(("dtype", "tolerance"), [("fp32", 1e-4), ("bf16", 0.1)])
def test_packed_logits_equal_the_plain_path_to_rounding(dtype, tolerance):
    plain, _ = load_model(dtype=dtype)
    packed, _ = load_model(dtype=dtype, packed=True)
    assert any(isinstance(m, PackedLinear) for m in packed.modules())
    assert not any(isinstance(m, torch.nn.Linear) for m in packed.modules())
    ids = torch.randint(
        3, plain.config.vocab_size, (70,), generator=torch.Generator().manual_seed(0)
    )
    a, b = logits(plain, ids, [30, 40]), logits(packed, ids, [30, 40])
    assert (a - b).abs().max().item() < tolerance * a.abs().max().item()


def test_the_engine_makes_the_same_greedy_tokens_packed_or_plain():
    def greedy(packed):
        model, tokenizer = load_model(packed=packed)
        engine = build_engine(model, tokenizer, kv_tokens=1024, max_running=4)
        params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        prompts = ["A tuple is", "The scheduler", "def main():", "Fairness means"]
        requests = [engine.add_request(p, params) for p in prompts]
        while engine.has_unfinished():
            engine.step()
        return [r.output_ids for r in requests]

    assert greedy(packed=True) == greedy(packed=False)


def test_a_packed_product_equals_the_plain_one_and_packing_fuses_what_shares_an_input():
    weight, x = torch.randn(12, 8), torch.randn(3, 8)
    torch.testing.assert_close(PackedLinear(weight)(x), x @ weight.T, rtol=1e-5, atol=1e-6)
    model, _ = load_model(packed=True)
    layer = model.layers[0]
    assert not hasattr(layer.self_attn, "q_proj") and not hasattr(layer.mlp, "gate_proj")
    c = model.config
    assert layer.self_attn.qkv_proj.out_features == (c.n_heads + 2 * c.n_kv_heads) * c.head_dim
    assert layer.mlp.gate_up_proj.out_features == 2 * c.ffn_dim


def test_llm_packs_on_the_cpu_in_fp32_and_bf16_and_not_in_fp16():
    from minivtc.offline.llm import LLM

    def packed(dtype):
        return any(isinstance(m, PackedLinear) for m in LLM(dtype=dtype).model.modules())

    assert packed("float32") and packed("bfloat16") and not packed("float16")
