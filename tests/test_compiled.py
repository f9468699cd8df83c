"""The compiled forward pass (`model/compiled.py`) against the plain path it replaces: the same
logits to float rounding under any attention, the same greedy tokens from the engine (steps
that prefill, decode, and do both at once), and the refusals."""

import httpx
import pytest
import torch

from minivtc.engine.factory import build_engine
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


def logits(model, ids, lens):
    positions = torch.cat([torch.arange(n) for n in lens])
    return model(ids, positions, CausalSequences(lens), None).float()


def test_compiled_logits_equal_the_plain_path_to_rounding(compiled):
    plain, _ = load_model()
    ids = torch.randint(
        3, plain.config.vocab_size, (70,), generator=torch.Generator().manual_seed(0)
    )
    a, b = logits(plain, ids, [30, 40]), logits(compiled, ids, [30, 40])
    assert (a - b).abs().max().item() < 1e-4 * a.abs().max().item()
    layer = compiled.layers[0]  # fused as packed.py fuses, left plain for the compiler
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


def test_an_attention_that_fails_fails_the_call_and_the_next_call_is_served(compiled):
    def broken(layer, q, k, v):
        raise RuntimeError("attention failed")

    ids = torch.arange(3, 13)
    with pytest.raises(RuntimeError, match="attention failed"):
        compiled(ids, torch.arange(10), broken, None)
    plain, _ = load_model()
    torch.testing.assert_close(logits(compiled, ids, [10]), logits(plain, ids, [10]))


def test_a_packed_or_compiled_model_is_refused(compiled):
    with pytest.raises(ValueError, match="not packed, not compiled"):
        compile_model(compiled)
    with pytest.raises(ValueError, match="not both"):
        load_model(packed=True, compiled=True)
    with pytest.raises(ValueError, match="not packed, not compiled"):
        compile_model(load_model(packed=True)[0])


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
