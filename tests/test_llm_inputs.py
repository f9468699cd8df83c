"""Nothing a caller sends poisons an `LLM`: every prompt form is read and checked before
anything is queued, and after each kind of bad input a valid `generate` gives the tokens a
fresh `LLM` gives. And vLLM's prompt forms (`offline/inputs.py`) all mean what vLLM says."""

from __future__ import annotations

import pytest

from minivtc.engine.sampler import SamplingParams
from minivtc.offline.llm import LLM

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
PROMPTS = ["The list", "A module is"]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(check_invariants=True)


@pytest.fixture(scope="module")
def fresh_tokens() -> list[list[int]]:
    return [o.token_ids for o in LLM().generate(PROMPTS, GREEDY, use_tqdm=False)]


BAD_INPUTS = [
    ([{"prompt": 5}], "'prompt' must be a string"),
    ([{"prompt_token_ids": "The list"}], "must be a list of token ids"),
    ([{"prompt": "x", "prompt_token_ids": [1]}], "needs one of"),
    ([{}], "needs one of"),
    ([{"prompt": "x", "multi_modal_data": {}}], "not supported"),
    ([{"prompt": "x", "cache_salt": 3}], "cache_salt must be a string"),
    (["fine", [1, 99999]], r"token ids must be in \[0, 4096\)"),
    (["fine", [1, -3]], r"token ids must be in \[0, 4096\)"),
    (["fine", [1, "a"]], "token ids must be ints"),
    (["fine", [1, True]], "token ids must be ints"),
    (["fine", [1, 2.0]], "token ids must be ints"),
    (["fine", []], "the prompt is empty"),
    (["fine", None], "a prompt is a string or a list of token ids"),
    (["fine", 7], "a prompt is a string or a list of token ids"),
    (["fine", [1] * 3000], "exceeds the model's context"),
    (5, "prompts must be a string"),
]


@pytest.mark.parametrize("prompts, message", BAD_INPUTS)
def test_a_bad_prompt_is_refused_before_anything_is_queued(llm, fresh_tokens, prompts, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(prompts, GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished() and not llm.engine.requests
    got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert got == fresh_tokens


@pytest.mark.parametrize(
    "sampling_params, message",
    [
        ([GREEDY], "1 SamplingParams for 2 prompts"),
        ([GREEDY, "greedy"], "a SamplingParams or a list"),
        ({"temperature": 0}, "a SamplingParams or a list"),
        ([GREEDY, SamplingParams(max_tokens=3000)], "exceeds the model's context"),
    ],
)
def test_bad_sampling_params_are_refused_and_change_nothing(
    llm, fresh_tokens, sampling_params, message
):
    with pytest.raises(ValueError, match=message):
        llm.generate(PROMPTS, sampling_params, use_tqdm=False)
    assert not llm.engine.requests
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == fresh_tokens


def test_every_prompt_form_means_what_vllm_says(llm, fresh_tokens):
    ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    forms = [
        PROMPTS,
        [{"prompt": p} for p in PROMPTS],
        [{"prompt_token_ids": i} for i in ids],
        ids,
        [{"prompt": PROMPTS[0]}, ids[1]],
    ]
    for form in forms:
        outs = llm.generate(form, sampling_params=GREEDY, use_tqdm=False)
        assert [o.token_ids for o in outs] == fresh_tokens, form
    # one prompt: a string, a dict, a flat list of ids
    for one in (PROMPTS[0], {"prompt": PROMPTS[0]}, {"prompt_token_ids": ids[0]}, ids[0]):
        [out] = llm.generate(one, GREEDY, use_tqdm=False)
        assert out.token_ids == fresh_tokens[0]
    [as_ids] = llm.generate({"prompt_token_ids": ids[0]}, GREEDY, use_tqdm=False)
    assert as_ids.prompt is None and as_ids.prompt_token_ids == ids[0]
    assert llm.generate([], GREEDY, use_tqdm=False) == []


def test_one_sampling_params_per_prompt(llm, fresh_tokens):
    short = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    outs = llm.generate(PROMPTS, [GREEDY, short], use_tqdm=False)
    assert outs[0].token_ids == fresh_tokens[0]
    assert outs[1].token_ids == fresh_tokens[1][:2]


@pytest.mark.parametrize("prompt", [[1, 4096], [1, None], (1, False), {"prompt": "x"}, 3.5])
def test_the_engine_itself_refuses_what_its_model_cannot_read(llm, fresh_tokens, prompt):
    """The server's path: `Engine.add_request` refuses an id past the vocabulary (it would fail
    the shared forward pass of the whole step) and anything that is no prompt."""
    from minivtc.engine.intake import RequestRejected

    with pytest.raises(RequestRejected):
        llm.engine.add_request(prompt, GREEDY)
    assert not llm.engine.requests
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == fresh_tokens
