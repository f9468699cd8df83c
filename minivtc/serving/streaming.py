"""How a request's outputs reach its caller: one SSE event per token, or one whole response.

Owns: `respond` (queue the request's completions on the engine loop, then stream or collect),
the SSE event stream and the collector, and what a client that goes away does (its requests are
aborted at once, their KV blocks freed). A body may ask for several completions, `n` of each
prompt in a list (OpenAI's choice `index` is prompt * n + sample): each is an engine request of
the caller's client, scheduled and charged as a separate request would be (`offline/llm.py` says
how), and a stream interleaves their chunks as their tokens come. A request that failed alone
ends its stream with one error event (an OpenAI error object), or its response with a 500. Does
not own routes (`server.py`). Lesson 9.

Logprobs are written as OpenAI's two APIs spell them, from a request's `Logprob`s
(`engine/sampler.py`): the legacy completions shape (`completion_logprobs`: parallel lists
`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`) and chat's (`chat_logprobs`: one
object per token with its `bytes` and `top_logprobs`). A token's text is `Tokenizer.token_text`
(its leading space kept), so a completion's tokens joined spell its text.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from minivtc.engine.engine import RequestRejected
from minivtc.engine.sampler import Logprob
from minivtc.model.tokenizer import Tokenizer
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import StepOutput
from minivtc.serving.api_keys import Caller
from minivtc.serving.engine_loop import EngineLoop, Stream
from minivtc.serving.openai_api import FINISH_REASONS, APIError, ChunkShape, Sampling, usage
from minivtc.serving.server_state import ServerState

__all__ = ["format_logprobs", "respond"]

Entry = dict[int, Logprob]  # the chosen token first, then the top k


@dataclass(frozen=True)
class Choice:
    """One completion of the response: its engine request's stream, and the prompt text
    to show before it (`echo`)."""

    index: int
    prompt_index: int
    stream: Stream
    echo: str = ""


@dataclass(frozen=True)
class Reply:
    """What every chunk of one response shares: its shape, and what it reports."""

    shape: ChunkShape
    tokenizer: Tokenizer
    top_logprobs: int | None  # None: no logprobs asked for
    include_usage: bool = False
    continuous_usage: bool = False


async def respond(
    state: ServerState,
    http: Request,
    body: Sampling,
    prompts: list[list[int]],
    params: SamplingParams,
    caller: Caller,
    chat: bool,
    echoes: list[str] | None = None,
):
    """Queue every completion `body` asks for, then stream them or answer once: the route's
    last step, on the server's engine loop, with its model name and tokenizer."""
    loop = state.loop
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    choices = await queue_all(loop, prompts, params, caller, request_id, echoes)
    options = body.stream_options
    reply = Reply(
        ChunkShape(request_id, state.model_name, int(time.time()), chat),
        state.tokenizer,
        params.logprobs,
        include_usage=options is not None and options.include_usage,
        continuous_usage=options is not None and options.continuous_usage_stats,
    )
    if body.stream:
        return StreamingResponse(sse(loop, choices, reply), media_type="text/event-stream")
    return await collect(loop, http, choices, reply)


async def queue_all(
    loop: EngineLoop,
    prompts: list[list[int]],
    params: SamplingParams,
    caller: Caller,
    request_id: str,
    echoes: list[str] | None,
) -> list[Choice]:
    """Every completion queued, or none: a refusal takes back those queued before it."""
    choices: list[Choice] = []
    try:
        for i, ids in enumerate(prompts):
            for k in range(params.n):
                one = params.sample(k)  # (max_tokens resolved by the engine, `checked_params`)
                index = i * params.n + k
                rid = request_id if index == 0 else f"{request_id}-{index}"
                stream = await loop.add(ids, one, caller.client, rid, caller.cache_salt)
                choices.append(Choice(index, i, stream, echoes[i] if echoes else ""))
    except RequestRejected as e:
        abort_all(loop, choices)
        if e.kind == "rate_limited":
            raise APIError(429, e.reason, None, "rate_limit_exceeded", "requests") from None
        raise APIError(400, e.reason, e.param, "context_length_exceeded") from None
    except RuntimeError as e:  # the engine loop is dead
        abort_all(loop, choices)
        raise APIError(503, str(e), kind="server_error") from None
    except BaseException:
        abort_all(loop, choices)
        raise
    return choices


def abort_all(loop: EngineLoop, choices: list[Choice]) -> None:
    for c in choices:
        if not c.stream.request.is_finished:
            loop.abort(c.stream.request.request_id)


def usage_of(choices: list[Choice], counts: list[int] | None = None) -> dict:
    """The prompt tokens once per prompt (its samples share it), every completion's tokens
    (`counts`: those streamed so far; the engine may be steps ahead of the stream)."""
    firsts = {c.prompt_index: c.stream.request for c in reversed(choices)}
    return usage(
        sum(r.num_prompt for r in firsts.values()),
        sum(counts) if counts else sum(c.stream.request.num_output for c in choices),
        sum(r.num_cached for r in firsts.values()),
    )


async def next_output(stream: Stream) -> StepOutput:
    item = await stream.outputs.get()
    if isinstance(item, BaseException):  # the engine loop died under this request
        raise APIError(500, f"the engine failed: {item!r}", kind="server_error")
    if item.finish_reason == "error":  # this request alone failed; the engine serves on
        raise APIError(500, f"serving this request failed: {item.error}", kind="server_error")
    return item


async def sse(loop: EngineLoop, choices: list[Choice], reply: Reply) -> AsyncIterator[str]:
    """One `data:` event per generated token of any choice (text may be empty while a
    character is incomplete or a stop sequence might be starting), then usage if asked, then
    [DONE]."""
    counts = [0] * len(choices)  # tokens seen per choice
    sent = [len(c.echo) for c in choices]  # characters sent per choice (for text_offset)
    try:
        async for i, out in merged(choices):
            if isinstance(out, APIError):
                yield event(out.body())
                return
            c, k = choices[i], counts[i]
            counts[i] += 1
            text = (c.echo if k == 0 else "") + out.text_delta
            reason = FINISH_REASONS.get(out.finish_reason or "") if out.finished else None
            logprobs = chunk_logprobs(reply, c, k, sent[i] - len(c.echo) * (k == 0))
            sent[i] += len(out.text_delta)
            chunk = reply.shape.head(streaming=True)
            chunk["choices"] = [reply.shape.choice(text, reason, True, k == 0, c.index, logprobs)]
            if reply.include_usage or reply.continuous_usage:
                chunk["usage"] = usage_of(choices, counts) if reply.continuous_usage else None
            yield event(chunk)
        if reply.include_usage:
            yield event(
                {**reply.shape.head(streaming=True), "choices": [], "usage": usage_of(choices)}
            )
        yield "data: [DONE]\n\n"
    finally:  # the client went away, a choice failed or the loop died: free the blocks now
        abort_all(loop, choices)


async def merged(choices: list[Choice]) -> AsyncIterator[tuple[int, StepOutput | APIError]]:
    """The choices' outputs as they come, until every one has finished (or one failed). One
    choice (nearly every request) is read straight from its stream; several are read by a
    task each into one queue, in the order their tokens come."""
    if len(choices) == 1:
        async for out in outputs_of(choices[0].stream):
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: Stream) -> None:
        async for out in outputs_of(stream):
            await queue.put((i, out))

    tasks = [asyncio.create_task(pump(i, c.stream)) for i, c in enumerate(choices)]
    try:
        for _ in range(len(choices)):  # each finishes once (or fails once)
            while True:
                i, out = await queue.get()
                yield i, out
                if isinstance(out, APIError):
                    return
                if out.finished:
                    break
    finally:
        for task in tasks:
            task.cancel()


async def outputs_of(stream: Stream) -> AsyncIterator[StepOutput | APIError]:
    """One stream's outputs up to its last, or up to the error that ended it."""
    while True:
        try:
            out = await next_output(stream)
        except APIError as e:
            yield e
            return
        yield out
        if out.finished:
            return


def chunk_logprobs(reply: Reply, choice: Choice, k: int, offset: int) -> dict | None:
    """The logprobs of choice's token k, as one chunk carries them."""
    if reply.top_logprobs is None:
        return None
    request = choice.stream.request
    tokens, entries = request.output_ids[k : k + 1], (request.logprobs or [])[k : k + 1]
    return format_logprobs(reply, tokens, entries, offset + len(choice.echo))


def format_logprobs(reply: Reply, tokens: list[int], entries: list, offset: int) -> dict:
    top = reply.top_logprobs
    assert top is not None, "asked for only when logprobs were"
    if reply.shape.chat:
        return chat_logprobs(reply.tokenizer, tokens, entries, top)
    return completion_logprobs(reply.tokenizer, tokens, entries, top, offset)


def piece(tokenizer: Tokenizer, token: int) -> str:
    return tokenizer.token_text(token)


def top_k(entry: Entry, k: int) -> list[tuple[int, Logprob]]:
    """The k likeliest of an entry (its chosen token among them only if it ranks so)."""
    return sorted(entry.items(), key=lambda item: item[1].rank)[:k]


def completion_logprobs(
    tokenizer: Tokenizer, tokens: list[int], entries: list[Entry], k: int, offset: int
) -> dict:
    """`tokens` and their entries; `offset`: characters of text before the first of them."""
    pieces = [piece(tokenizer, t) for t in tokens]
    offsets = []
    for p in pieces:
        offsets.append(offset)
        offset += len(p)
    return {
        "tokens": pieces,
        "token_logprobs": [e[t].logprob for t, e in zip(tokens, entries, strict=True)],
        "top_logprobs": [
            {piece(tokenizer, t): lp.logprob for t, lp in top_k(e, k)} for e in entries
        ],
        "text_offset": offsets,
    }


def chat_logprobs(tokenizer: Tokenizer, tokens: list[int], entries: list[Entry], k: int) -> dict:
    def one(token: int, logprob: float) -> dict:
        text = piece(tokenizer, token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    content = [
        {**one(t, e[t].logprob), "top_logprobs": [one(u, lp.logprob) for u, lp in top_k(e, k)]}
        for t, e in zip(tokens, entries, strict=True)
    ]
    return {"content": content}


def event(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def collect(loop: EngineLoop, http: Request, choices: list[Choice], reply: Reply):
    """Wait for every completion, aborting if the client disconnects meanwhile (checked
    twice a second: outputs arrive every step, so waiting for a quiet moment would not do)."""
    next_check = time.monotonic() + 0.5
    try:
        for c in choices:
            finished = False
            while not finished:
                try:
                    finished = (await asyncio.wait_for(next_output(c.stream), 0.5)).finished
                except TimeoutError:
                    pass
                if not finished and time.monotonic() >= next_check:
                    if await http.is_disconnected():
                        return JSONResponse({}, status_code=499)  # nobody will read it
                    next_check = time.monotonic() + 0.5
        # Built and serialized off the event loop: with logprobs, one response may hold
        # hundreds of thousands of entries (each token's text decoded), seconds of work
        body = await asyncio.to_thread(whole_response, reply, choices)
        return Response(body, media_type="application/json")
    finally:
        abort_all(loop, choices)


def whole_response(reply: Reply, choices: list[Choice]) -> bytes:
    answer = {
        **reply.shape.head(streaming=False),
        "choices": [whole_choice(reply, c) for c in choices],
        "usage": usage_of(choices),
    }
    return bytes(JSONResponse(answer).body)  # (its encoding: UTF-8, no NaN, compact)


def whole_choice(reply: Reply, c: Choice) -> dict:
    r = c.stream.request
    reason = FINISH_REASONS.get(r.finish_reason or "", "stop")
    logprobs = None
    if reply.top_logprobs is not None:
        logprobs = format_logprobs(reply, r.output_ids, r.logprobs or [], len(c.echo))
    choice = reply.shape.choice(c.echo + r.text, reason, False, True, c.index, logprobs)
    return {**choice, "stop_reason": r.stop_reason}
