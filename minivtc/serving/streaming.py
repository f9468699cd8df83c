"""How a request's outputs reach its caller: one SSE event per token, or one whole response.

Owns: `respond` (queue the request on the engine loop, then stream or collect), the SSE event
stream and the collector, and what a client that goes away does (its request is aborted at
once, its KV blocks freed). A request that failed alone ends its stream with one error event (an
OpenAI error object), or its response with a 500. Does not own routes (`server.py`). Lesson 8.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from minivtc.core.engine import RequestRejected
from minivtc.core.params import SamplingParams
from minivtc.core.request import StepOutput
from minivtc.serving.api_keys import Caller
from minivtc.serving.engine_loop import EngineLoop, Stream
from minivtc.serving.openai_api import FINISH_REASONS, APIError, ChunkShape, Sampling, usage


async def respond(
    loop: EngineLoop,
    model_name: str,
    http: Request,
    body: Sampling,
    prompt_ids: list[int],
    params: SamplingParams,
    caller: Caller,
    chat: bool,
):
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    try:
        stream = await loop.add(prompt_ids, params, caller.client, request_id, caller.cache_salt)
    except RequestRejected as e:
        if e.kind == "rate_limited":
            raise APIError(429, e.reason, None, "rate_limit_exceeded", "requests") from None
        raise APIError(400, e.reason, e.param, "context_length_exceeded") from None
    except RuntimeError as e:  # the engine loop is dead
        raise APIError(503, str(e), kind="server_error") from None
    shape = ChunkShape(request_id, model_name, int(time.time()), chat)
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(
            sse(loop, stream, shape, include_usage), media_type="text/event-stream"
        )
    return await collect(loop, http, stream, shape)


def usage_of(stream: Stream) -> dict:
    r = stream.request
    return usage(r.num_prompt, r.num_output, r.num_cached)


async def next_output(stream: Stream) -> StepOutput:
    item = await stream.outputs.get()
    if isinstance(item, BaseException):  # the engine loop died under this request
        raise APIError(500, f"the engine failed: {item!r}", kind="server_error")
    if item.finish_reason == "error":  # this request alone failed; the engine serves on
        raise APIError(500, f"serving this request failed: {item.error}", kind="server_error")
    return item


async def sse(
    loop: EngineLoop, stream: Stream, shape: ChunkShape, include_usage: bool
) -> AsyncIterator[str]:
    """One `data:` event per generated token (text may be empty while a character is
    incomplete or a stop sequence might be starting), then usage if asked, then [DONE]."""
    finished, first = False, True
    try:
        while not finished:
            try:
                out = await next_output(stream)
            except APIError as e:
                finished = True  # the engine has already let it go
                yield event(e.body())
                return
            finished = out.finished
            reason = FINISH_REASONS.get(out.finish_reason or "") if finished else None
            chunk = shape.head(streaming=True)
            chunk["choices"] = [shape.choice(out.text_delta, reason, True, first)]
            if include_usage:
                chunk["usage"] = None
            first = False
            yield event(chunk)
        if include_usage:
            yield event({**shape.head(streaming=True), "choices": [], "usage": usage_of(stream)})
        yield "data: [DONE]\n\n"
    finally:
        if not finished:  # the client went away (or the loop died): free its blocks now
            loop.abort(stream.request.request_id)


def event(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def collect(loop: EngineLoop, http: Request, stream: Stream, shape: ChunkShape):
    """Wait for the whole completion, aborting if the client disconnects meanwhile (checked
    twice a second: outputs arrive every step, so waiting for a quiet moment would not do)."""
    finished, next_check = False, time.monotonic() + 0.5
    try:
        while not finished:
            try:
                finished = (await asyncio.wait_for(next_output(stream), timeout=0.5)).finished
            except TimeoutError:
                pass
            if not finished and time.monotonic() >= next_check:
                if await http.is_disconnected():
                    return JSONResponse({}, status_code=499)  # nobody will read it
                next_check = time.monotonic() + 0.5
        reason = FINISH_REASONS.get(stream.request.finish_reason or "", "stop")
        text = stream.request.text
        return {
            **shape.head(streaming=False),
            "choices": [shape.choice(text, reason, streaming=False, first=True)],
            "usage": usage_of(stream),
        }
    finally:
        if not finished:
            loop.abort(stream.request.request_id)
