"""OpenAI's API as the server speaks it (`openai_api.py`): a validation failure as one sentence
naming the field, what the server refuses rather than ignores, and the response objects, which
the `openai` package's own types must accept. No engine: bodies are validated as FastAPI does."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.testclient import TestClient
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import ValidationError

from minivtc.requests.params import MAX_SEED
from minivtc.serving.openai_api import (
    APIError,
    ChatBody,
    ChunkShape,
    CompletionBody,
    check_unsupported,
    usage,
    validation_error,
)

MODEL = "minivtc-tiny"


def error_for(body, kind=CompletionBody) -> APIError:
    with pytest.raises(ValidationError) as e:
        kind.model_validate(body)
    return validation_error(e.value.errors())


BAD_BODIES = {
    "unknown field": (
        {"prompt": "x", "temprature": 1},
        "temprature",
        "Unrecognized request argument supplied: temprature",
    ),
    "missing field": ({"max_tokens": 3}, "prompt", "you must provide 'prompt'"),
    "list body": ([1, 2], None, "the body must be a JSON object"),
    "string body": ("prompt", None, "the body must be a JSON object"),
    "wrong type": (
        {"prompt": "x", "max_tokens": "5"},
        "max_tokens",
        "invalid value for 'max_tokens': Input should be a valid integer",
    ),
    "out of range": (
        {"prompt": "x", "seed": MAX_SEED + 1},
        "seed",
        f"invalid value for 'seed': Input should be less than or equal to {MAX_SEED}",
    ),
    "nested": (
        {"prompt": "x", "stream_options": {"include_usage": 1}},
        "stream_options.include_usage",
        "Input should be a valid boolean",
    ),
}


@pytest.mark.parametrize("body, param, message", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_a_validation_error_is_one_sentence_naming_the_field(body, param, message):
    error = error_for(body)
    assert (error.status, error.param) == (400, param)
    assert message in error.message and "\n" not in error.message


SURROGATES = {
    "prompt": ({"prompt": "a\ud800"}, CompletionBody, "prompt", 1),
    "prompt list": ({"prompt": ["ok", "\udfff"]}, CompletionBody, "prompt.1", 0),
    "stop": ({"prompt": "x", "stop": "\ud800"}, CompletionBody, "stop", 0),
    "stop list": ({"prompt": "x", "stop": ["ok", "ab\udc00"]}, CompletionBody, "stop.1", 2),
    "user": ({"prompt": "x", "user": "\ud800"}, CompletionBody, "user", 0),
    "message": (
        {"messages": [{"role": "user", "content": "\ud800"}]},
        ChatBody,
        "messages.0.content",
        0,
    ),
}


@pytest.mark.parametrize("body, kind, param, at", SURROGATES.values(), ids=SURROGATES.keys())
def test_a_lone_surrogate_reports_the_unicode_problem_not_the_union(body, kind, param, at):
    """A union field (str | list[int] | list[str]) fails once per member; the message is our
    own check's, not "Input should be a valid string"."""
    error = error_for(body, kind)
    assert (error.status, error.param) == (400, param)
    assert error.message == (
        f"invalid value for '{param}': not valid Unicode text "
        f"(surrogates not allowed at character {at})"
    )


def test_too_many_stop_sequences_says_so():
    error = error_for({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})
    assert error.param == "stop" and "4" in error.message


@pytest.fixture(scope="module")
def app() -> TestClient:
    """The server's validation handler over the body types, as FastAPI calls it."""
    api = FastAPI()

    @api.exception_handler(RequestValidationError)
    async def invalid_body(request, e: RequestValidationError):
        return validation_error(e.errors()).response()

    @api.post("/v1/completions")
    async def completions(body: CompletionBody) -> dict:
        return {}

    @api.post("/v1/chat/completions")
    async def chat(body: ChatBody) -> dict:
        return {}

    return TestClient(api)


@pytest.mark.parametrize(
    "path, content, param, message",
    [
        ("/v1/completions", b'{"prompt": "x",', None, "the body is not valid JSON"),
        ("/v1/completions", b"[1, 2]", None, "the body must be a JSON object"),
        ("/v1/completions", b'{"prompt": "\\ud800"}', "prompt", "not valid Unicode text"),
        ("/v1/chat/completions", b'{"messages": [], "n": 1}', "messages", "at least 1 item"),
        ("/v1/completions", b'{"prompt": "x", "bogus": 1}', "bogus", "Unrecognized request"),
    ],
)
def test_fastapis_errors_become_openais_body(app, path, content, param, message):
    """What FastAPI reports (locations under "body", a JSON decoding error) reads the same."""
    r = app.post(path, content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == param and message in error["message"]
    assert error["type"] == "invalid_request_error"


def test_no_errors_at_all_is_still_a_400():
    assert validation_error([]).status == 400


PROMPT = {"prompt": "x"}
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def body(kind=CompletionBody, **fields):
    return kind.model_validate((PROMPT if kind is CompletionBody else CHAT) | fields)


REFUSED = {
    "stream_options": {"stream_options": {"include_usage": True}},  # without stream: true
    "logit_bias": {"logit_bias": {"42": 1.0}},
    "echo": {"echo": True, "logprobs": 1},  # echo with logprobs: prompt logprobs
    "best_of": {"best_of": 2},
    "suffix": {"suffix": "."},
}


@pytest.mark.parametrize("param, fields", REFUSED.items(), ids=REFUSED.keys())
def test_what_the_server_does_not_do_is_refused_by_name(param, fields):
    with pytest.raises(APIError) as e:
        check_unsupported(body(**fields), MODEL)
    assert (e.value.status, e.value.param) == (400, param)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"model": MODEL},
        {"n": 1},
        {"n": 3, "best_of": 3},
        {"stream": True, "stream_options": {"include_usage": True}},
        {"stream": True, "stream_options": {"continuous_usage_stats": True}},
        {"presence_penalty": 0.5, "frequency_penalty": -1.0, "repetition_penalty": 1.2},
        {"logprobs": 2},
        {"echo": True},
        {"logit_bias": {}},
        {"best_of": 1},
        {"suffix": ""},
        {"min_tokens": 2, "min_p": 0.1, "top_k": -1, "stop_token_ids": [13]},
        {"skip_special_tokens": False, "include_stop_str_in_output": True},
    ],
)
def test_vllms_fields_and_the_harmless_values_of_the_others_are_accepted(fields):
    check_unsupported(body(**fields), MODEL)


def test_another_model_is_404_and_chat_bodies_are_checked_too():
    with pytest.raises(APIError) as e:
        check_unsupported(body(model="gpt-4"), MODEL)
    assert (e.value.status, e.value.code, e.value.param) == (404, "model_not_found", "model")
    assert "'gpt-4' does not exist" in e.value.message and MODEL in e.value.message
    check_unsupported(body(ChatBody), MODEL)  # no echo, best_of, suffix fields at all
    check_unsupported(body(ChatBody, n=3, logprobs=True, top_logprobs=2), MODEL)
    check_unsupported(body(model="an-alias"), MODEL, ("an-alias",))


def test_completion_objects_are_what_the_openai_client_parses():
    shape = ChunkShape("cmpl-1", MODEL, 1700000000, chat=False)
    whole = {
        **shape.head(streaming=False),
        "usage": usage(3, 4),
        "choices": [shape.choice("Hello", "length", streaming=False, first=True)],
    }
    parsed = Completion.model_validate(whole)
    assert parsed.choices[0].text == "Hello" and parsed.usage.total_tokens == 7
    assert shape.head(streaming=True) == shape.head(streaming=False)  # one object for both
    first = shape.choice("He", None, streaming=True, first=True)
    assert first == {"index": 0, "logprobs": None, "finish_reason": None, "text": "He"}
    last = {
        **shape.head(streaming=True),
        "choices": [shape.choice("llo", "stop", streaming=True, first=False)],
    }
    assert Completion.model_validate(last).choices[0].finish_reason == "stop"


def test_chat_objects_are_what_the_openai_client_parses():
    shape = ChunkShape("chatcmpl-1", MODEL, 1700000000, chat=True)
    whole = ChatCompletion.model_validate(
        {
            **shape.head(streaming=False),
            "usage": usage(5, 2),
            "choices": [shape.choice("Hi there", "stop", streaming=False, first=True)],
        }
    )
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert whole.choices[0].message.content == "Hi there"

    def chunk(text, reason, first):
        return ChatCompletionChunk.model_validate(
            {**shape.head(streaming=True), "choices": [shape.choice(text, reason, True, first)]}
        )

    opening = chunk("Hi", None, first=True).choices[0]
    assert (opening.delta.role, opening.delta.content) == ("assistant", "Hi")
    middle = chunk(" there", None, first=False).choices[0]
    assert (middle.delta.role, middle.delta.content) == (None, " there")
    held_back = chunk("", None, first=False).choices[0]  # no text this step, and not the end
    assert held_back.delta.content == ""
    closing = shape.choice("", "length", streaming=True, first=False)
    assert (
        closing["delta"] == {} and chunk("", "length", False).choices[0].finish_reason == "length"
    )
    tail = {**shape.head(streaming=True), "choices": [], "usage": usage(5, 2)}
    assert ChatCompletionChunk.model_validate(tail).usage.completion_tokens == 2


def test_stream_lines_split_at_newlines_only_not_at_unicode_line_separators():
    """Issue: the gateway split a backend's stream with `splitlines` (httpx's aiter_lines), so a
    chunk whose text holds a raw U+2028 or U+0085 (vLLM writes raw UTF-8) reached the caller cut
    in two, the rest dropped. Lines end at b"\\n" (CRLF too) and nowhere else, whatever the
    network's cuts; a line without end is refused rather than held without bound."""
    import asyncio

    from minivtc.serving.connections import MAX_SSE_LINE_BYTES, sse_lines

    chunk = json.dumps({"text": "a\u2028b\u0085c\u2029d"}, ensure_ascii=False).encode()
    stream = b"data: " + chunk + b"\r\n\r\ndata: [DONE]\n\n"

    async def lines(parts: list[bytes]) -> list[bytes]:
        async def chunks():
            for part in parts:
                yield part

        return [line async for line in sse_lines(chunks())]

    for cut in range(1, len(stream)):
        got = asyncio.run(lines([stream[:cut], stream[cut:]]))
        assert got == [b"data: " + chunk, b"", b"data: [DONE]", b""], cut
    assert json.loads(got[0][len(b"data: ") :])["text"] == "a\u2028b\u0085c\u2029d"
    with pytest.raises(ValueError, match="line over"):
        asyncio.run(lines([b"data: " + b"x" * MAX_SSE_LINE_BYTES, b"x"]))
