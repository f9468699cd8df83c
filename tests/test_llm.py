"""The offline API in vLLM's spelling: `from minivtc import LLM, SamplingParams`, `LLM(model=...)`,
and `generate` returning vLLM-shaped outputs, checked against the plain generation loop."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from minivtc.engine.generate import generate_plain
from minivtc.engine.sampler import SamplingParams
from minivtc.model.weights import BUNDLED_WEIGHTS
from minivtc.offline.llm import LLM, CompletionOutput, RequestOutput

PROMPTS = ["The list", "A module is"]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM()


def test_import_minivtc_leaves_torch_out_and_exports_vllm_names():
    """In a fresh interpreter: the package (and the command line's module) import no torch, and
    the exports are the objects their own modules define."""
    script = textwrap.dedent("""
        import sys
        import minivtc, minivtc.cli.main
        assert "torch" not in sys.modules, "import minivtc imported torch"
        assert {"LLM", "SamplingParams"} <= set(dir(minivtc)), dir(minivtc)
        from minivtc import LLM, SamplingParams
        import minivtc.offline.llm, minivtc.engine.sampler
        assert LLM is minivtc.offline.llm.LLM
        assert SamplingParams is minivtc.engine.sampler.SamplingParams
        try:
            minivtc.NoSuchThing
        except AttributeError as e:
            assert "NoSuchThing" in str(e), e
        else:
            raise AssertionError("minivtc.NoSuchThing did not raise AttributeError")
        from minivtc.fairness import scheduler  # submodules still import by name
        assert scheduler is sys.modules["minivtc.fairness.scheduler"]
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_model_keyword_weights_dir_and_the_default_load_the_same_model(llm):
    expect = [(out.token_ids, out.text) for out in llm.generate(PROMPTS, GREEDY)]
    for other in (
        LLM(model=BUNDLED_WEIGHTS),
        LLM(str(BUNDLED_WEIGHTS)),
        LLM(weights_dir=BUNDLED_WEIGHTS),
    ):
        assert [(out.token_ids, out.text) for out in other.generate(PROMPTS, GREEDY)] == expect


def test_model_and_weights_dir_must_agree(tmp_path):
    LLM(model=BUNDLED_WEIGHTS, weights_dir=BUNDLED_WEIGHTS / ".." / BUNDLED_WEIGHTS.name)
    with pytest.raises(ValueError, match="give one"):
        LLM(model=BUNDLED_WEIGHTS, weights_dir=tmp_path)


def test_generate_returns_vllm_shaped_outputs_in_prompt_order(llm):
    outs = llm.generate(PROMPTS, GREEDY)
    assert [out.prompt for out in outs] == PROMPTS
    assert len({out.request_id for out in outs}) == len(PROMPTS)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert isinstance(out, RequestOutput) and out.finished
        assert out.prompt_token_ids == llm.tokenizer.encode(prompt)
        [completion] = out.outputs  # one completion per prompt
        assert isinstance(completion, CompletionOutput) and completion.index == 0
        assert len(completion.token_ids) == GREEDY.max_tokens  # ignore_eos: exactly max_tokens
        assert completion.finish_reason == "length"
        ids = out.prompt_token_ids + completion.token_ids
        assert llm.tokenizer.decode(ids) == prompt + completion.text
        assert completion.text and completion.text == llm.tokenizer.decode(ids)[len(prompt) :]
        # the shorthand for one completion per prompt
        assert (out.text, out.token_ids, out.finish_reason) == (
            completion.text,
            completion.token_ids,
            completion.finish_reason,
        )


def test_token_id_prompts_have_no_prompt_text(llm):
    ids = llm.tokenizer.encode(PROMPTS[0])
    [out] = llm.generate([ids], GREEDY)
    assert out.prompt is None and out.prompt_token_ids == ids
    assert out.token_ids == llm.generate(PROMPTS[0], GREEDY)[0].token_ids


def test_greedy_generate_equals_the_plain_loop(llm, bundled):
    model, tokenizer = bundled
    params = SamplingParams(temperature=0, max_tokens=16)
    for prompt, out in zip(PROMPTS, llm.generate(PROMPTS, params), strict=True):
        assert out.token_ids == list(generate_plain(model, tokenizer.encode(prompt), params))


def test_llm_with_blocks_on_demand_and_fair_preemption_gives_the_same_tokens(llm):
    """`LLM(..., reservation="none", victim="fair")` in a pool too small for its prompts: they
    are preempted on the way and still get the tokens of a roomy pool."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompts = ["A tuple is", "The for statement", "Exceptions are", "A module is"]
    tight = LLM(reservation="none", victim="fair", policy="vtc", kv_tokens=96, block_size=16)
    got = tight.generate(prompts, params)
    assert tight.engine.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in got] == [
        o.outputs[0].token_ids for o in llm.generate(prompts, params)
    ]
