"""The routes that answer about the model rather than generate: OpenAI's `/v1/models`, and
vLLM's `/v1/models/{id}`, `/tokenize`, `/detokenize`, `/version` and `/ping`, with vLLM's
bodies and answers.

Owns those routes and their bodies. The model's id is the served name, else the checkpoint
path as given (`minivtc serve`); other served names are aliases. `/tokenize` takes a prompt
(`{"prompt", "add_special_tokens"}`) or a chat (`{"messages", "add_generation_prompt"}`,
through the server's chat template) and answers `{"count", "max_model_len", "tokens"}`;
`/detokenize` takes `{"tokens"}` and answers `{"prompt"}`. With keys, each needs one, as
`/v1` does (`middleware.py`). Lesson 9.
"""

from __future__ import annotations

import asyncio
import functools
from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from minivtc.model import chat
from minivtc.serving.openai_api import APIError, Message, Text, parse_json, validate
from minivtc.serving.prompts import check_length, check_message_count, check_tokens
from minivtc.serving.server_state import ServerState

__all__ = ["add_info_routes"]


class TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: Text | None = None
    prompt: Text | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: Text | None = None
    tokens: list[int] = Field(max_length=1_000_000)


def add_info_routes(app: FastAPI) -> None:
    app.get("/v1/models")(models)
    app.get("/v1/models/{model_id:path}")(model)
    app.post("/tokenize")(tokenize)
    app.post("/detokenize")(detokenize)
    app.get("/version")(server_version)
    app.get("/ping")(ping)
    app.post("/ping")(ping)


async def models(http: Request):
    state: ServerState = http.app.state.minivtc
    return {"object": "list", "data": [model_card(state, n) for n in state.names]}


async def model(http: Request, model_id: str):
    """vLLM's `/v1/models/{id}` (the id may hold slashes: a path as given)."""
    state: ServerState = http.app.state.minivtc
    if model_id not in state.names:
        raise APIError(404, f"the model '{model_id}' does not exist", "model", "model_not_found")
    return model_card(state, model_id)


def model_card(state: ServerState, name: str) -> dict:
    return {
        "id": name,
        "object": "model",
        "created": state.created,
        "owned_by": "minivtc",
        "root": state.model_name,
        "parent": None,
        "max_model_len": state.prompt_limits.tokens,
    }


async def tokenize(http: Request):
    """Through the same door as `/v1`: the body's limits before any work, and all of it
    (parsing, the chat template, tokenizing, each token's text) on a worker thread."""
    state: ServerState = http.app.state.minivtc
    work = functools.partial(tokenize_answer, state, await http.body())
    if state.chat_template is None:
        return await asyncio.to_thread(work)
    return await asyncio.get_running_loop().run_in_executor(state.renders, work)


def tokenize_answer(state: ServerState, raw: bytes) -> dict:
    data = parse_json(raw)
    check_message_count(state.prompt_limits, data)  # before any per-message work
    body = validate(TokenizeBody, data)
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give one of 'prompt' or 'messages'", "prompt")
    check_model(state, body.model)
    if body.prompt is not None:
        check_length(state.prompt_limits, len(body.prompt), "prompt")
        ids = state.tokenizer.encode(body.prompt, body.add_special_tokens)
    else:
        assert body.messages is not None  # (one of the two, checked above)
        check_length(state.prompt_limits, sum(len(m.text) for m in body.messages), "messages")
        messages = [{"role": m.role, "content": m.text} for m in body.messages]
        try:
            limit = state.prompt_limits.max_chars
            ids = chat.prompt_ids(
                state.tokenizer, messages, state.chat_template, body.add_generation_prompt, limit
            )
        except ValueError as e:
            raise APIError(400, str(e), "messages") from None
    check_tokens(state.prompt_limits, len(ids), "messages" if body.messages else "prompt")
    answer = {"count": len(ids), "max_model_len": state.prompt_limits.tokens, "tokens": ids}
    if not body.return_token_strs:  # per-token work only when asked
        return answer | {"token_strs": None}
    pieces = [state.tokenizer.decode([t], skip_special_tokens=False) for t in ids]
    return answer | {"token_strs": pieces}


async def detokenize(http: Request):
    """As `/tokenize`: parsing a million ids and decoding them, on a worker thread."""
    state: ServerState = http.app.state.minivtc
    return await asyncio.to_thread(detokenize_answer, state, await http.body())


def detokenize_answer(state: ServerState, raw: bytes) -> dict:
    body = validate(DetokenizeBody, parse_json(raw))
    check_model(state, body.model)
    vocab = state.tokenizer.vocab_size
    if any(not 0 <= t < vocab for t in body.tokens):
        raise APIError(400, f"token ids must be in [0, {vocab})", "tokens")
    return {"prompt": state.tokenizer.decode(body.tokens)}


def check_model(state: ServerState, name: str | None) -> None:
    if name is not None and name not in state.names:
        raise APIError(404, f"the model '{name}' does not exist", "model", "model_not_found")


async def server_version():
    try:
        return {"version": version("minivtc")}
    except PackageNotFoundError:  # a source tree on PYTHONPATH, not installed
        return {"version": "unknown"}


async def ping(http: Request):
    """vLLM's liveness check: 200 while the engine loop runs, else 503 (as `/health`)."""
    alive = http.app.state.minivtc.loop.alive
    return Response(status_code=200 if alive else 503)
