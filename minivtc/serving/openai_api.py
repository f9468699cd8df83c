"""OpenAI's API as this server speaks it: request bodies, the error body, response objects.

Owns: the pydantic bodies of `/v1/completions` and `/v1/chat/completions` (OpenAI's field names,
unknown fields refused as OpenAI does), `APIError` (every error the server answers, in OpenAI's
shape `{"error": {"message", "type", "param", "code"}}`), parsing a body (`parse_json`,
`validate`) with each failure as one sentence that names the field and quotes at most
`ECHO_CHARS` of the input, and the shape of the response objects and stream chunks. Does not
own: routes, the engine, who the caller is (`server.py`, `api_keys.py`). Lesson 9.

Every string a caller sends must be text that UTF-8 can carry: JSON may spell a lone surrogate
(`"\\ud800"`), which Python keeps in a `str` and which then fails to encode much later, inside
the tokenizer or the metrics. `Text` refuses it here, at the door, with a 400.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Literal, TypeVar

from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from minivtc.requests.params import MAX_LOGPROBS, MAX_SEED

__all__ = ["APIError", "ChatBody", "ChunkShape", "CompletionBody", "FINISH_REASONS"]
__all__ += ["MAX_CLIENT_ID_CHARS", "MAX_N", "Message", "Sampling", "Text", "check_roles"]
__all__ += ["check_unsupported", "clip", "parse_json", "usage", "validate", "validation_error"]

MAX_CLIENT_ID_CHARS = 128  # a client id is a name, not a payload: longer ones are refused
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "abort": "abort"}
ECHO_CHARS = 200  # an error message quotes at most this much of what the caller sent
MAX_N = 16  # completions one request may ask for (n, or prompts in a list): each is a request


def valid_unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"not valid Unicode text ({e.reason} at character {e.start})") from None
    return text


Text = Annotated[str, AfterValidator(valid_unicode)]


# --- request bodies ------------------------------------------------------------------------------


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage so far in every chunk


class Sampling(BaseModel):
    """Fields shared by both endpoints: OpenAI's, and vLLM's extensions (`top_k`, `min_p`,
    `repetition_penalty`, `min_tokens`, `stop_token_ids`, `ignore_eos`, `skip_special_tokens`,
    `include_stop_str_in_output`), with `SamplingParams`' meanings."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: Text | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    # (an empty stop sequence is refused by name when the params are built: `sampling_params`)
    stop: Text | Annotated[list[Text], Field(max_length=4)] | None = None
    stop_token_ids: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=64)] | None = None
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)  # 64-bit, as vLLM checks
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Text | None = None
    ignore_eos: bool = False
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=2.0)
    min_tokens: int = Field(default=0, ge=0)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Accepted at their defaults only (a non-default value is a clear 400, not silently ignored).
    logit_bias: dict[str, float] | None = None


class CompletionBody(Sampling):
    prompt: (
        Text
        | list[int]
        | Annotated[list[Text], Field(min_length=1, max_length=MAX_N)]
        | (Annotated[list[list[int]], Field(min_length=1, max_length=MAX_N)])
    )
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = None
    suffix: Text | None = None


def text_only(kind: str) -> str:
    if kind != "text":
        raise ValueError(f"a {clip(kind)!r} part is not supported: text only (a Llama-2 model)")
    return kind


class TextPart(BaseModel):
    """A part of a message's content: this server reads text parts only."""

    model_config = ConfigDict(extra="allow", strict=True)  # (an image's fields: refused by type)
    type: Annotated[str, AfterValidator(text_only)]
    text: Text | None = None  # (required of a text part: `Message.text` says so)


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart]
    name: Text | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)


class ChatBody(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)


Body = TypeVar("Body", bound=BaseModel)


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object, or a 400 that says why not. (Large bodies: call it on a
    worker thread; `server.py` does.)"""
    if not raw.strip():
        raise APIError(400, "the body is empty: send a JSON object")
    try:
        data = json.loads(raw)
    except RecursionError:
        raise APIError(400, "the body is nested too deeply to parse") from None
    except ValueError as e:  # not JSON, not UTF-8, or an integer over Python's 4300 digits
        raise APIError(400, f"the body is not valid JSON: {clip(str(e))}") from None
    if not isinstance(data, dict):
        raise APIError(400, "the body must be a JSON object")
    return data


def validate(kind: type[Body], data: dict) -> Body:
    """`data` as the body `kind`, or a 400 naming the field at fault."""
    try:
        return kind.model_validate(data)
    except ValidationError as e:
        raise validation_error(e.errors(include_url=False)) from None


def check_roles(messages: list[Message]) -> None:
    """Llama-2's chat template: one optional system (or developer) message, then user and
    assistant turns alternating, ending with a user turn. The first message out of place is
    named."""
    start = 1 if messages[0].role in ("system", "developer") else 0
    if start == len(messages):
        raise APIError(400, "a system message must be followed by a user message", "messages")
    for i, m in enumerate(messages[start:], start):
        want = "user" if (i - start) % 2 == 0 else "assistant"
        if m.role != want:
            raise APIError(
                400,
                f"messages[{i}] is '{m.role}' where '{want}' must be: after one optional system "
                "message, roles alternate user, assistant, ..., ending with user",
                "messages",
            )
    if messages[-1].role != "user":
        raise APIError(400, "the last message must be from the user", "messages")


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` as an error message may quote it: at most `limit` characters."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


# --- errors --------------------------------------------------------------------------------------


class APIError(Exception):
    """An error answered as OpenAI does: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status,
            message,
            param,
            code,
            kind,
        )

    def body(self) -> dict:
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        return {"error": error}

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def validation_error(errors) -> APIError:
    """pydantic's first complaint as one sentence naming the field (OpenAI answers 400)."""
    if not errors:
        return APIError(400, "invalid request body")
    # A union (str | list[int] | list[str]) reports one error per member, a type mismatch for
    # each member the value is not: the first complaint that is not one says what is wrong
    # (not valid Unicode; more than 4 stop sequences).
    first = next((e for e in errors if not e["type"].endswith("_type")), errors[0])
    if first["type"] == "json_invalid":  # (FastAPI's body parsing; the routes use parse_json)
        return APIError(400, f"the body is not valid JSON: {clip(first.get('msg', ''))}")
    loc = [str(x) for x in first["loc"] if x != "body"]
    if not loc and first["type"] in ("model_attributes_type", "dict_type", "model_type"):
        return APIError(400, "the body must be a JSON object")
    # A union (str | list[int] | ...) reports one error per member: name the field, not them.
    loc = [x for x in loc if x not in ("str", "int", "float", "bool") and "[" not in x]
    loc = [x for x in loc if not x.startswith("function-after")]  # the Text validator's name
    param = clip(".".join(loc)) or None
    if first["type"] == "extra_forbidden":
        return APIError(400, f"Unrecognized request argument supplied: {param}", param)
    if first["type"] == "missing":
        return APIError(400, f"you must provide '{param}'", param)
    message = clip(str(first["msg"]).removeprefix("Value error, "))
    return APIError(400, f"invalid value for '{param}': {message}", param)


def check_unsupported(body: Sampling, model_name: str, aliases: tuple[str, ...] = ()) -> None:
    """Refuse what this server does not do, rather than silently ignoring it. `aliases`: other
    names the model answers to (vLLM's `--served-model-name` takes several)."""
    if body.model is not None and body.model not in (model_name, *aliases):
        raise APIError(
            404,
            f"the model '{clip(body.model)}' does not exist; this server serves '{model_name}'",
            "model",
            "model_not_found",
        )
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options is only allowed with stream: true", "stream_options")
    if getattr(body, "echo", False) and getattr(body, "logprobs", None) is not None:
        raise APIError(400, "echo with logprobs (prompt logprobs) is not supported", "echo")
    # Accepted only at a value that changes nothing: anything else is refused, never ignored.
    harmless: dict[str, tuple[object, ...]] = {
        "logit_bias": (None, {}),
        "best_of": (None, 1, body.n),
        "suffix": (None, ""),
    }
    for name, allowed in harmless.items():
        if getattr(body, name, allowed[0]) not in allowed:
            raise APIError(400, f"'{name}' is not supported by this server", name)


# --- responses -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkShape:
    """What every response object of one request shares."""

    request_id: str
    model: str
    created: int
    chat: bool

    def head(self, streaming: bool) -> dict:
        kind = "chat.completion" if self.chat else "text_completion"
        if self.chat and streaming:
            kind = "chat.completion.chunk"
        return {"id": self.request_id, "object": kind, "created": self.created, "model": self.model}

    def choice(
        self,
        text: str,
        finish_reason: str | None,
        streaming: bool,
        first: bool,
        index: int = 0,
        logprobs: dict | None = None,
    ) -> dict:
        choice: dict = {"index": index, "logprobs": logprobs, "finish_reason": finish_reason}
        if not self.chat:
            choice["text"] = text
        elif streaming:
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            choice["delta"] = delta if (text or first or finish_reason is None) else {}
        else:
            choice["message"] = {"role": "assistant", "content": text}
        return choice


def usage(num_prompt: int, num_output: int, num_cached: int = 0) -> dict:
    """OpenAI's usage block; `num_cached`: prompt tokens served from the prefix cache."""
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_output,
        "total_tokens": num_prompt + num_output,
        "prompt_tokens_details": {"cached_tokens": num_cached},
    }
