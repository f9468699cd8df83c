"""The routes that answer about the model rather than generate: OpenAI's `/v1/models`, and
vLLM's `/v1/models/{id}`, `/tokenize`, `/detokenize`, `/version` and `/ping`, with vLLM's
bodies and answers.

Owns those routes and their bodies. The model's id is the served name, else the checkpoint
path as given (`minivtc serve`); other served names are aliases. `/tokenize` takes a prompt
(`{"prompt", "add_special_tokens"}`) or a chat (`{"messages", "add_generation_prompt"}`,
through the server's chat template) and answers `{"count", "max_model_len", "tokens"}`;
`/detokenize` takes `{"tokens"}` and answers `{"prompt"}`. With keys, each needs one, as
`/v1` does (`middleware.py`). Lesson 8.
"""

from __future__ import annotations

import asyncio
from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from minivtc.model import chat
from minivtc.serving.openai_api import APIError, Message, Text, parse_json, validate
from minivtc.serving.server_state import ServerState


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
        "max_model_len": state.room.tokens,
    }


async def tokenize(http: Request):
    state = http.app.state.minivtc
    body = validate(TokenizeBody, parse_json(await http.body()))
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give one of 'prompt' or 'messages'", "prompt")
    check_model(state, body.model)
    if body.prompt is not None:
        ids = await asyncio.to_thread(state.tokenizer.encode, body.prompt, body.add_special_tokens)
    else:
        assert body.messages is not None  # (one of the two, checked above)
        messages = [{"role": m.role, "content": m.text} for m in body.messages]
        try:
            ids = chat.prompt_ids(
                state.tokenizer, messages, state.chat_template, body.add_generation_prompt
            )
        except ValueError as e:
            raise APIError(400, str(e), "messages") from None
    answer = {"count": len(ids), "max_model_len": state.room.tokens, "tokens": ids}
    pieces = [state.tokenizer.decode([t], skip_special_tokens=False) for t in ids]
    return answer | {"token_strs": pieces if body.return_token_strs else None}


async def detokenize(http: Request):
    state = http.app.state.minivtc
    body = validate(DetokenizeBody, parse_json(await http.body()))
    check_model(state, body.model)
    vocab = state.tokenizer.vocab_size
    if any(not 0 <= t < vocab for t in body.tokens):
        raise APIError(400, f"token ids must be in [0, {vocab})", "tokens")
    return {"prompt": await asyncio.to_thread(state.tokenizer.decode, body.tokens)}


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
