"""How `n` samples and prompt lists are charged (`offline/llm.py`): as that many separate
requests of the caller, the prompt once per sample (each sample prefills it) and every
sample's tokens, so neither buys a place in the queue that separate requests would not."""

from __future__ import annotations

import itertools

import pytest

from minivtc.model.weights import BUNDLED_WEIGHTS
from minivtc.offline.inputs import plan
from minivtc.offline.llm import LLM
from minivtc.requests.params import SamplingParams

PROMPT = "The list"
EACH = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)


@pytest.fixture(scope="module")
def vtc() -> LLM:
    ticks = itertools.count()  # a clock that never repeats: admission order is exact
    return LLM(BUNDLED_WEIGHTS, policy="vtc", max_num_seqs=1, clock=lambda: next(ticks))


def counter(llm: LLM, client: str = "default") -> float:
    return llm.engine.scheduler.ledger.accounts()[client][0]


def test_n_samples_are_charged_as_n_separate_requests():
    one, many = (LLM(policy="vtc") for _ in range(2))
    one.generate(PROMPT, SamplingParams(**{**EACH.__dict__, "n": 3}), use_tqdm=False)
    many.generate([PROMPT] * 3, EACH, use_tqdm=False)
    num_prompt = len(one.tokenizer.encode(PROMPT))
    # w_p = 1 per prompt token, w_q = 2 per output token (the paper's): 3 prompts, 15 outputs
    assert counter(one) == counter(many) == 3 * num_prompt + 2 * 3 * EACH.max_tokens


def admission_order(llm: LLM, a_uses_n: bool) -> list[str]:
    """Client A asks for 4 samples (n=4, or 4 requests); B sends 4 requests; one at a time."""
    engine = llm.engine
    ids = llm.tokenizer.encode(PROMPT)
    if a_uses_n:
        _, _, samples = plan(engine, PROMPT, SamplingParams(**{**EACH.__dict__, "n": 4}), EACH)
        a = [engine.add_request(ids, s.params, client_id="A") for s in samples]
    else:
        a = [engine.add_request(ids, EACH, client_id="A") for _ in range(4)]
    b = [engine.add_request(ids, EACH, client_id="B") for _ in range(4)]
    while engine.has_unfinished():
        engine.step()
    return [r.client_id for r in sorted(a + b, key=lambda r: r.admitted_time)]


def test_n_does_not_jump_the_queue(vtc):
    with_n = admission_order(vtc, a_uses_n=True)
    assert with_n == admission_order(vtc, a_uses_n=False)
    assert with_n[:4].count("A") == 2  # VTC alternates: A's samples wait their turns
