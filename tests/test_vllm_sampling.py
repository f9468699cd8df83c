"""vLLM's SamplingParams and outputs: greedy tokens and logprobs equal `transformers`',
penalties equal its logits processors on the same logits, and n, stop_token_ids, min_tokens,
include_stop_str_in_output, max_tokens=None and top_k=-1 mean what vLLM says."""

from __future__ import annotations

import pytest
import torch

from minivtc.engine.sampler import min_p_filter, penalize, penalize_row
from minivtc.model.weights import BUNDLED_WEIGHTS
from minivtc.offline.llm import LLM
from minivtc.offline.outputs import completion
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request

transformers = pytest.importorskip("transformers")
PROMPTS = ["The list", "A module is"]
NEWLINE = 13  # the bundled model writes it within its first tokens


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM()


@pytest.fixture(scope="module")
def hf():
    return transformers.LlamaForCausalLM.from_pretrained(BUNDLED_WEIGHTS, dtype=torch.float32)


def test_greedy_tokens_logprobs_and_prompt_logprobs_equal_transformers(llm, hf):
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=3, prompt_logprobs=2)
    for out in llm.generate(PROMPTS, params, use_tqdm=False):
        ids = out.prompt_token_ids + out.token_ids
        with torch.no_grad():
            lp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)  # (T, V)
        n = len(out.prompt_token_ids)
        expect = hf.generate(
            torch.tensor([out.prompt_token_ids]), do_sample=False, max_new_tokens=8
        )
        assert out.token_ids == expect[0, n:].tolist()
        done = out.outputs[0]
        total = 0.0
        for j, (token, entry) in enumerate(zip(done.token_ids, done.logprobs, strict=True)):
            row = lp[n - 1 + j]
            assert list(entry)[0] == token and entry[token].rank == 1  # greedy: the likeliest
            assert set(entry) == set(row.topk(3).indices.tolist()) | {token}
            for t, got in entry.items():
                assert got.logprob == pytest.approx(float(row[t]), abs=1e-4)
                assert got.decoded_token == llm.tokenizer.token_text(t)
            total += float(row[token])
        assert done.cumulative_logprob == pytest.approx(total, abs=1e-3)
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == n
        for j in range(1, n):
            token = out.prompt_token_ids[j]
            entry = out.prompt_logprobs[j]
            assert entry[token].logprob == pytest.approx(float(lp[j - 1, token]), abs=1e-4)
            assert entry[token].rank == int((lp[j - 1] > lp[j - 1, token]).sum()) + 1


def request_with(prompt, output, **params) -> Request:
    r = Request("r", "c", list(prompt), SamplingParams(**params), 0.0)
    r.output_ids = list(output)
    return r


def test_repetition_penalty_equals_transformers_processor():
    logits = torch.randn(2, 64, generator=torch.Generator().manual_seed(0))
    prompt, output = [1, 5, 9, 9], [5, 30, 2]
    for penalty in (1.3, 0.7):
        got = penalize(logits, [request_with(prompt, output, repetition_penalty=penalty)] * 2, 2)
        processor = transformers.RepetitionPenaltyLogitsProcessor(penalty)
        expect = processor(torch.tensor([prompt + output] * 2), logits.clone())
        torch.testing.assert_close(got, expect)


def test_presence_and_frequency_penalties_are_openais_on_output_tokens_only():
    logits = torch.randn(1, 64, generator=torch.Generator().manual_seed(1))
    prompt, output = [1, 7, 7], [5, 5, 5, 30]
    r = request_with(prompt, output, presence_penalty=0.5, frequency_penalty=0.25)
    got = penalize(logits, [r], 2)[0]
    expect = logits[0].clone()
    for token in set(
        output
    ):  # OpenAI: mu[j] - c[j] * alpha_frequency - (c[j] > 0) * alpha_presence
        expect[token] -= output.count(token) * 0.25 + 0.5
    torch.testing.assert_close(got, expect)  # token 7 (prompt only) untouched


def test_min_tokens_bans_eos_and_stop_tokens_until_then():
    logits = torch.zeros(1, 64)
    early = request_with([1], [4], min_tokens=3, stop_token_ids=[9])
    got = penalize(logits, [early], 2)[0]
    assert got[2] == got[9] == -float("inf") and (got[[0, 1, 3]] == 0).all()
    late = request_with([1], [4, 4, 4], min_tokens=3, stop_token_ids=[9])
    assert penalize(logits, [late], 2) is logits  # nothing to do: not even a copy


def test_min_p_equals_transformers_warper():
    logits = torch.randn(1, 64, generator=torch.Generator().manual_seed(2)) * 3
    probs = torch.softmax(logits[0].double(), dim=-1)
    kept = min_p_filter(probs, 0.1) > 0
    warped = transformers.MinPLogitsWarper(0.1)(torch.tensor([[1]]), logits.clone())[0]
    assert torch.equal(kept, warped > -float("inf"))


def test_stop_token_ids_end_with_their_token_named(llm):
    [plain] = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=12))
    assert NEWLINE in plain.token_ids
    [stopped] = llm.generate(
        PROMPTS[1], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[NEWLINE])
    )
    first = plain.token_ids.index(NEWLINE)
    assert stopped.token_ids == plain.token_ids[: first + 1]  # the stop token is an output
    assert stopped.finish_reason == "stop" and stopped.outputs[0].stop_reason == NEWLINE
    tok = llm.get_tokenizer()
    text = tok.decode(stopped.prompt_token_ids + stopped.token_ids)[len(PROMPTS[1]) :]
    assert stopped.text == text.removesuffix("\n")  # its text is not shown, as in vLLM
    params = SamplingParams(
        temperature=0, max_tokens=12, stop_token_ids=[NEWLINE], include_stop_str_in_output=True
    )
    assert llm.generate(PROMPTS[1], params, use_tqdm=False)[0].text == text  # unless asked


def test_a_natural_eos_is_finish_reason_stop_with_no_stop_reason(llm):
    """The engine says "eos"; vLLM's outputs say "stop" (and stop_reason None)."""
    r = request_with([1, 5], [7, llm.tokenizer.eos_token_id])
    r.finish_reason = "eos"
    done = completion(0, r, llm.tokenizer)
    assert (done.finish_reason, done.stop_reason) == ("stop", None)


def test_min_tokens_holds_off_the_stop_token(llm):
    params = SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[NEWLINE], min_tokens=6)
    [out] = llm.generate(PROMPTS[1], params, use_tqdm=False)
    assert len(out.token_ids) > 6 and NEWLINE not in out.token_ids[:6]
    assert out.finish_reason == "length" or out.token_ids[-1] == NEWLINE


def test_stop_strings_with_and_without_include_stop_str_in_output(llm):
    [plain] = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=20))
    stop = plain.text[4:7]
    cut = plain.text.index(stop)
    for include, text in ((False, plain.text[:cut]), (True, plain.text[: cut + len(stop)])):
        params = SamplingParams(
            temperature=0, max_tokens=20, stop=[stop], include_stop_str_in_output=include
        )
        [out] = llm.generate(PROMPTS[0], params, use_tqdm=False)
        assert (out.text, out.finish_reason, out.outputs[0].stop_reason) == (text, "stop", stop)


def test_n_samples_have_indexes_and_their_own_seeds(llm):
    [greedy] = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=6, n=3))
    assert [c.index for c in greedy.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in greedy.outputs}) == 1
    params = SamplingParams(temperature=1.0, max_tokens=8, n=3, seed=7, ignore_eos=True)
    [sampled] = llm.generate(PROMPTS[0], params, use_tqdm=False)
    assert len({tuple(c.token_ids) for c in sampled.outputs}) == 3  # (seeds 7, 8, 9)
    again = llm.generate(PROMPTS[0], params, use_tqdm=False)[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in sampled.outputs]
    seed8 = SamplingParams(temperature=1.0, max_tokens=8, seed=8, ignore_eos=True)
    assert llm.generate(PROMPTS[0], seed8)[0].token_ids == sampled.outputs[1].token_ids


def test_top_k_minus_one_is_no_cut_and_max_tokens_none_fills_the_context():
    small = LLM(max_model_len=40)
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=None, ignore_eos=True, top_k=-1)
    [out] = small.generate(PROMPTS[0], params, use_tqdm=False)
    assert len(out.prompt_token_ids) + len(out.token_ids) == 40
    [same] = small.generate(PROMPTS[0], SamplingParams(**{**params.__dict__, "top_k": 0}))
    assert same.token_ids == out.token_ids
    assert out.finish_reason == "length"


def test_metrics_are_in_order(llm):
    [out] = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=4))
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
    assert m.time_in_queue == pytest.approx(m.first_scheduled_time - m.arrival_time)


@pytest.mark.parametrize("penalty", [1e-300, 1e-45, 1e300])
def test_an_extreme_repetition_penalty_keeps_the_logits_finite(penalty):
    """Issue: `repetition_penalty: 1e-300` (inside the allowed range) made the logits of the seen
    tokens inf and the server answered 500 "probability tensor contains inf/nan". Now they are
    kept finite: with a tiny penalty the seen tokens win, with a huge one they lose."""
    logits = torch.tensor([3.0, -2.0, 1.0, 0.5])
    params = SamplingParams(repetition_penalty=penalty)
    out = penalize_row(logits, [0, 1], [], params)
    assert torch.isfinite(out).all(), out
    probs = torch.softmax(out, -1)
    assert torch.isfinite(probs).all()
    assert (out.argmax() == 0) == (penalty < 1)
