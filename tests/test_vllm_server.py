"""The requests vLLM's server accepts, through the real `openai` client against a real server
on the bundled model: each answer equals the offline `LLM`'s for the same params (same engine
code, same tokens), and `n` or a prompt list is charged like as many separate requests."""

from __future__ import annotations

import httpx
import pytest

from minivtc.engine.factory import build_engine
from minivtc.engine.sampler import SamplingParams
from minivtc.model.weights import load_model
from minivtc.offline.llm import LLM
from minivtc.serving.hosting import BackgroundServer
from minivtc.serving.server import make_app

openai = pytest.importorskip("openai")
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"


@pytest.fixture(scope="module")
def offline() -> LLM:
    return LLM()


@pytest.fixture(scope="module")
def url():
    # packed like the offline LLM's (and `minivtc serve`'s): the same kernels, the same logprobs
    model, tokenizer = load_model(packed=True)
    engine = build_engine(model, tokenizer, "vtc", kv_tokens=2048, check_invariants=True)
    app = make_app(engine, tokenizer, "llama-tiny", aliases=("other-name",))
    with BackgroundServer(app) as url:
        yield url
        assert httpx.get(url + "/health").status_code == 200, "the engine loop died"


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_n_logprobs_and_penalties_equal_the_offline_llm(url, offline):
    params = dict(max_tokens=6, temperature=0, presence_penalty=0.5, n=2)
    extra = {"repetition_penalty": 1.3, "min_tokens": 2, "ignore_eos": True}
    got = client(url).completions.create(
        model="llama-tiny", prompt="The list", logprobs=2, extra_body=extra, **params
    )
    sp = SamplingParams(**params, **extra, logprobs=2)
    [want] = offline.generate("The list", sp, use_tqdm=False)
    assert [c.index for c in got.choices] == [0, 1]
    for choice, completion in zip(got.choices, want.outputs, strict=True):
        assert choice.text == completion.text
        lps = choice.logprobs
        assert lps.token_logprobs == pytest.approx(
            [e[t].logprob for t, e in zip(completion.token_ids, completion.logprobs, strict=True)]
        )
        assert all(len(top) == 2 for top in lps.top_logprobs)
        assert lps.text_offset[0] == 0 and "".join(lps.tokens) == choice.text
    n_prompt = len(want.prompt_token_ids)
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (n_prompt, 12)


def test_a_prompt_list_with_echo_and_stop_token_ids(url, offline):
    prompts = ["The list", "A module is"]
    got = client(url).completions.create(
        model="other-name",  # an alias
        prompt=prompts,
        max_tokens=8,
        temperature=0,
        echo=True,
        extra_body={"stop_token_ids": [13], "include_stop_str_in_output": True},
    )
    sp = SamplingParams(
        temperature=0, max_tokens=8, stop_token_ids=[13], include_stop_str_in_output=True
    )
    want = offline.generate(prompts, sp, use_tqdm=False)
    assert [c.text for c in got.choices] == [p + w.text for p, w in zip(prompts, want, strict=True)]
    assert [c.finish_reason for c in got.choices] == [w.finish_reason for w in want]


def test_chat_parts_developer_role_logprobs_and_continuous_usage(url, offline):
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "A list is"}]},
    ]
    chunks = list(
        client(url).chat.completions.create(
            model="llama-tiny",
            messages=messages,
            max_tokens=5,
            temperature=0,
            logprobs=True,
            top_logprobs=1,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"ignore_eos": True},
        )
    )
    plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "A list is"}]
    [want] = offline.chat(plain, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    tokens = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in tokens) == want.text
    assert [c.usage.completion_tokens for c in tokens] == [1, 2, 3, 4, 5]
    assert all(len(c.choices[0].logprobs.content[0].top_logprobs) == 1 for c in tokens)
    assert chunks[-1].usage.completion_tokens == 5 and not chunks[-1].choices


def test_tokenize_detokenize_version_ping_and_model_by_id(url, offline):
    tok = offline.get_tokenizer()
    r = httpx.post(url + "/tokenize", json={"prompt": "A list is"}).json()
    assert r["tokens"] == tok.encode("A list is") and r["count"] == len(r["tokens"])
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(url + "/tokenize", json=chat).json()["tokens"] == tok.chat_ids(
        chat["messages"]
    )
    assert httpx.post(url + "/detokenize", json={"tokens": r["tokens"]}).json() == {
        "prompt": "A list is"
    }
    assert httpx.post(url + "/detokenize", json={"tokens": [99999]}).status_code == 400
    assert "version" in httpx.get(url + "/version").json()
    assert httpx.get(url + "/ping").status_code == 200
    assert httpx.get(url + "/v1/models/other-name").json()["id"] == "other-name"
    assert httpx.get(url + "/v1/models/gpt-4").status_code == 404
    assert [m.id for m in client(url).models.list().data] == ["llama-tiny", "other-name"]


def test_n_is_charged_like_as_many_separate_requests(url):
    """Client A asks for n=3 in one request, B sends 3 requests: the same tokens, the same
    service (each sample's prompt and tokens, as for separate requests). (Their counters
    differ by the lift each got on joining, as any two clients' do.)"""
    body = {"model": "llama-tiny", "prompt": "The list", "max_tokens": 4, "ignore_eos": True}
    headers = lambda c: {"X-Client-Id": c}  # noqa: E731
    r = httpx.post(url + "/v1/completions", json=body | {"n": 3}, headers=headers("A"))
    assert r.status_code == 200 and len(r.json()["choices"]) == 3
    for _ in range(3):
        assert httpx.post(url + "/v1/completions", json=body, headers=headers("B")).is_success
    rows = httpx.get(url + "/fairness").json()["clients"]
    for field in ("input_tokens", "output_tokens", "service"):
        assert rows["A"][field] == rows["B"][field], field
