"""The compiled forward pass (`model/compiled.py`) against the plain path it replaces: the same
logits to float rounding under any attention (fp32 and bf16), the same greedy tokens from the
engine (steps that prefill, decode, and do both at once), no compile after a server's
`compile_shapes`, and the refusals."""

import httpx
import pytest
import torch

from minivtc.engine.factory import build_engine, compile_shapes
from minivtc.model.compiled import compile_model
from minivtc.model.llama import CausalSequences
from minivtc.model.packed import can_pack
from minivtc.model.weights import load_model
from minivtc.requests.params import SamplingParams
from tests.conftest import start_serve

pytestmark = pytest.mark.skipif(not can_pack(), reason="this PyTorch build has no oneDNN")


@pytest.fixture(scope="module")
def compiled():
    return load_model(compiled=True)[0]  # one model: each new shape compiles once


@torch.inference_mode()  # as the engine runs it: inductor freezes (packs) only without grad
def logits(model, ids, lens, attention=None):
    positions = torch.cat([torch.arange(n) for n in lens])
    return model(ids, positions, attention or CausalSequences(lens), None).float()


@pytest.mark.parametrize(("dtype", "tolerance"), [("fp32", 1e-4), ("bf16", 0.1)])
def test_compiled_logits_equal_the_plain_path_to_rounding(dtype, tolerance, compiled):
    plain, _ = load_model(dtype=dtype)
    model = compiled if dtype == "fp32" else load_model(dtype=dtype, compiled=True)[0]
    ids = torch.randint(
        3, plain.config.vocab_size, (70,), generator=torch.Generator().manual_seed(0)
    )
    a, b = logits(plain, ids, [30, 40]), logits(model, ids, [30, 40])
    assert (a - b).abs().max().item() < tolerance * a.abs().max().item()
    layer = model.layers[0]  # fused as packed.py fuses, left plain for the compiler
    assert isinstance(layer.self_attn.qkv_proj, torch.nn.Linear)
    assert not hasattr(layer.self_attn, "q_proj") and not hasattr(layer.mlp, "gate_proj")


def test_the_engine_makes_the_same_greedy_tokens_compiled_or_plain(compiled):
    def greedy(model):
        engine = build_engine(model, None, kv_tokens=1024, max_running=4)
        params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
        first = [engine.add_request([1, *range(5, 5 + n)], params) for n in (3, 11, 7)]
        for _ in range(4):  # decoding, one token a step
            engine.step()
        late = engine.add_request([1, *range(40, 52)], params)  # a prefill beside the decodes
        while engine.has_unfinished():
            engine.step()
        return [r.output_ids for r in [*first, late]]

    assert greedy(compiled) == greedy(load_model()[0])


def test_after_compile_shapes_a_varied_engine_compiles_nothing_more(compiled):
    """What a server relies on: no client's step waits for a compile."""
    compile_shapes(compiled)
    engine = build_engine(compiled, None, "vtc", kv_tokens=2048, max_running=8, prefix_caching=True)
    shared = list(range(100, 140))  # a prefix the cache serves to the later requests
    asks = [
        (shared + [7], SamplingParams(temperature=0, max_tokens=5)),
        (shared + [8, 9], SamplingParams(temperature=0.8, max_tokens=9, logprobs=2)),
        ([1, 5], SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=1)),
        ([1], SamplingParams(temperature=0, max_tokens=12)),
        (list(range(3, 70)), SamplingParams(temperature=0, max_tokens=4)),
    ]
    with torch.compiler.set_stance("fail_on_recompile"):
        for k, (prompt, params) in enumerate(asks):
            engine.add_request(prompt, params, client_id=f"c{k % 2}")
            engine.step()
        while engine.has_unfinished():
            engine.step()


def test_an_attention_that_fails_fails_the_call_and_is_forgotten(compiled):
    def broken(layer, q, k, v):
        raise RuntimeError("attention failed")

    ids = torch.arange(3, 13)
    with pytest.raises(RuntimeError, match="attention failed"):
        logits(compiled, ids, [10], broken)
    q = torch.zeros(1, 8, 32)
    with pytest.raises(RuntimeError, match="only inside a compiled model's forward call"):
        torch.ops.minivtc.step_attention(0, q, q[:, :2], q[:, :2])  # `broken` is gone
    torch.testing.assert_close(logits(compiled, ids, [10]), logits(load_model()[0], ids, [10]))


def test_a_packed_compiled_or_non_cpu_model_is_refused(compiled):
    with pytest.raises(ValueError, match="not packed, not compiled"):
        compile_model(compiled)
    with pytest.raises(ValueError, match="not both"):
        load_model(packed=True, compiled=True)
    with pytest.raises(ValueError, match="not packed, not compiled"):
        compile_model(load_model(packed=True)[0])
    with pytest.raises(ValueError, match="the CPU's path"):
        compile_model(load_model()[0].to("meta"))


@pytest.mark.slow
def test_serve_compiles_by_default_and_answers_as_the_eager_server_does():
    """`minivtc serve` compiles before its port opens (vLLM's default); `--enforce-eager` does
    not; both give the same greedy completion."""

    def complete(compiled):
        server, url = start_serve("--kv-tokens", "256", compiled=compiled)
        try:
            body = {"model": "minivtc-tiny", "prompt": "Fairness means", "max_tokens": 16}
            answer = httpx.post(url + "/v1/completions", json={**body, "temperature": 0})
            assert answer.status_code == 200, answer.text
            return answer.json()["choices"][0]["text"]
        finally:
            server.terminate()
            _, err = server.communicate(timeout=30)
            assert ("compiling the model's forward pass" in err) == compiled, err

    assert complete(compiled=True) == complete(compiled=False)
