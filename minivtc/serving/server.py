"""The local server: an OpenAI-compatible HTTP API over the engine, with a fairness view.

Owns: the FastAPI app (`make_app`) and its routes, the door every request passes first (body
size, API key), SSE streaming, and running it (`serve` in the foreground with a shutdown time
limit, `BackgroundServer` on a thread). The bodies and error shape are `openai_api.py`'s, who
the caller is `api_keys.py`'s, the reports `observability.py`'s. The engine runs on
`engine_loop.EngineLoop`'s thread, and nothing here touches it: handlers send the loop
commands, and read engine state only through a snapshot taken there. Lesson 8 uses it.

Follow one request: the door refuses a body over `max_body_bytes` (413) or a missing key (401)
before anything is parsed; `completions()` validates the body (a bad field is a 400 with an
OpenAI error body), names the client (`api_keys.Gate`), tokenizes the prompt on a worker thread
(a long prompt must not stall other streams), and `EngineLoop.add` queues it; the scheduler
decides when it runs; each step's `StepOutput` arrives on the request's queue and becomes an
SSE chunk (or, when not streaming, is collected into one response). A client that goes away is
aborted at once and its KV blocks return to the pool. A fault in one request's own work ends
that request alone (an error event, or a 500); one that leaves the engine unsound ends the
loop, `/health` answers 503, and `minivtc serve` exits non-zero for a supervisor to restart it.

Client weights come from the server's configuration (the keys file or `--client-weights`),
never from requests: a client cannot raise its own share.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from minivtc.core.engine import Engine, RequestRejected, StepOutput
from minivtc.core.sampler import SamplingParams
from minivtc.core.tokenizer import Tokenizer
from minivtc.serving.api_keys import Caller, Gate
from minivtc.serving.engine_loop import EngineLoop, Stream
from minivtc.serving.observability import fairness_view, prometheus_text
from minivtc.serving.openai_api import (
    FINISH_REASONS,
    APIError,
    ChatBody,
    ChunkShape,
    CompletionBody,
    Sampling,
    check_unsupported,
    usage,
    validation_error,
)

MAX_BODY_BYTES = 4 * 1024 * 1024  # a 2048-token prompt is ~10 kB of text: 4 MB is generous
CHARS_PER_TOKEN_BOUND = 4  # NFKC may compose up to ~3 code points into one; 4 is a safe margin


@dataclass
class ServerState:
    loop: EngineLoop
    tokenizer: Tokenizer
    model_name: str
    created: int
    gate: Gate
    context_room: int  # the most tokens one request may hold: min(context, pool)
    max_prompt_chars: int  # a longer text can never fit the context, whatever it tokenizes to


def make_app(
    engine: Engine, tokenizer: Tokenizer, model_name: str = "minivtc-tiny", *,
    gate: Gate | None = None, max_body_bytes: int = MAX_BODY_BYTES,
    on_fatal=None, forget_every_s: float = 10.0,
) -> FastAPI:  # fmt: skip
    """The app over `engine` (which it starts on a thread at startup and stops at shutdown).

    `gate`: API keys (default: none, every caller names itself: local use). `on_fatal(error)`:
    called if the engine fails beyond one request (`serve` uses it to exit non-zero)."""
    room = min(engine.max_positions, engine.allocator.num_tokens)
    longest_piece = max(len(tokenizer.sp.id_to_piece(i)) for i in range(tokenizer.vocab_size))
    state = ServerState(
        EngineLoop(engine, on_fatal=on_fatal, forget_every_s=forget_every_s), tokenizer,
        model_name, int(time.time()), gate or Gate(), room,
        max_prompt_chars=room * longest_piece * CHARS_PER_TOKEN_BOUND,
    )  # fmt: skip
    app = FastAPI(
        title="minivtc", lifespan=lifespan(state),
        description="OpenAI-compatible completions over minivtc's engine, scheduled fairly.",
    )  # fmt: skip
    app.state.minivtc = state
    add_error_handlers(app)
    app.add_middleware(Door, gate=state.gate, max_body_bytes=max_body_bytes)
    app.post("/v1/completions")(completions)
    app.post("/v1/chat/completions")(chat_completions)
    app.get("/v1/models")(models)
    app.get("/health")(health)
    app.get("/fairness")(fairness)
    app.get("/metrics", response_class=Response)(metrics)
    return app


def lifespan(state: ServerState):
    """Start the engine thread with the server, stop it on shutdown."""

    @asynccontextmanager
    async def run(app: FastAPI):
        state.loop.start()
        try:
            yield
        finally:
            state.loop.stop()

    return run


# --- routes --------------------------------------------------------------------------------------


async def completions(body: CompletionBody, http: Request):
    state: ServerState = http.app.state.minivtc
    caller = identify(state, http, body.user)
    check_unsupported(body, state.model_name)
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise APIError(400, "one prompt per request is supported", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, list):
        vocab = state.tokenizer.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise APIError(400, f"prompt token ids must be in [0, {vocab})", "prompt")
        prompt_ids = prompt
    else:
        check_length(state, len(prompt), "prompt")
        prompt_ids = await asyncio.to_thread(state.tokenizer.encode, prompt)  # off the event loop
    params = sampling_params(body, body.max_tokens or 16)
    return await respond(state, http, body, prompt_ids, params, caller, chat=False)


async def chat_completions(body: ChatBody, http: Request):
    state: ServerState = http.app.state.minivtc
    caller = identify(state, http, body.user)
    check_unsupported(body, state.model_name)
    check_length(state, sum(len(m.content) for m in body.messages), "messages")
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    try:
        prompt_ids = await asyncio.to_thread(state.tokenizer.chat_ids, messages)
    except ValueError as e:
        raise APIError(400, str(e), "messages") from None
    room = state.context_room - len(prompt_ids)
    max_tokens = body.max_completion_tokens or body.max_tokens or max(room, 1)
    params = sampling_params(body, max_tokens)
    return await respond(state, http, body, prompt_ids, params, caller, chat=True)


async def models(http: Request):
    state: ServerState = http.app.state.minivtc
    card = {"id": state.model_name, "object": "model", "created": state.created,
            "owned_by": "minivtc"}  # fmt: skip
    return {"object": "list", "data": [card]}


async def health(http: Request):
    state: ServerState = http.app.state.minivtc
    if not state.loop.alive:
        error = {"message": f"the engine loop is not running: {state.loop.error!r}"}
        return JSONResponse({"status": "dead", **error}, status_code=503)
    return {"status": "ok"}


async def fairness(http: Request):
    """Per client: counter, weight, waiting, running, tokens and service so far. With API keys,
    an admin key sees every client, any other key only its own client's row."""
    state: ServerState = http.app.state.minivtc
    caller = identify(state, http, None)
    snap = await snapshot(state)
    return await asyncio.to_thread(fairness_view, snap, None if caller.admin else caller.client)


async def metrics(http: Request):
    """Prometheus text. With API keys, for admin keys only."""
    state: ServerState = http.app.state.minivtc
    if not identify(state, http, None).admin:
        raise APIError(403, "/metrics needs an admin key", kind="permission_error")
    text = await asyncio.to_thread(prometheus_text, await snapshot(state))
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


# --- helpers -------------------------------------------------------------------------------------


def identify(state: ServerState, http: Request, user: str | None) -> Caller:
    return state.gate.caller(http.headers.get("authorization"), http.headers.get("x-client-id"),
                             user)  # fmt: skip


def check_length(state: ServerState, num_chars: int, param: str) -> None:
    """Refuse, before tokenizing it, a text too long to fit whatever it tokenizes to: one token
    covers at most `longest_piece` characters (after normalization)."""
    if num_chars > state.max_prompt_chars:
        raise APIError(
            400, f"the text is {num_chars} characters: it cannot fit the {state.context_room} "
            "tokens one request may hold", param, "context_length_exceeded",
        )  # fmt: skip


async def snapshot(state: ServerState):
    """The engine's state for a report, copied on the loop thread between two steps."""
    try:
        return await state.loop.call(state.loop.snapshot)
    except RuntimeError as e:  # the engine loop is dead
        raise APIError(503, str(e), kind="server_error") from None


def sampling_params(body: Sampling, max_tokens: int) -> SamplingParams:
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if any(not s for s in stop):
        raise APIError(400, "stop sequences must be non-empty strings", "stop")
    return SamplingParams(
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, max_tokens=max_tokens,
        stop=stop, seed=body.seed, ignore_eos=body.ignore_eos,
    )  # fmt: skip


async def respond(
    state: ServerState, http: Request, body: Sampling, prompt_ids: list[int],
    params: SamplingParams, caller: Caller, chat: bool,
):  # fmt: skip
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    try:
        stream = await state.loop.add(prompt_ids, params, caller.client, request_id)
    except RequestRejected as e:
        if e.kind == "rate_limited":
            raise APIError(429, e.reason, None, "rate_limit_exceeded", "requests") from None
        raise APIError(400, e.reason, e.param, "context_length_exceeded") from None
    except RuntimeError as e:  # the engine loop is dead
        raise APIError(503, str(e), kind="server_error") from None
    shape = ChunkShape(request_id, state.model_name, int(time.time()), chat)
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(
            sse(state.loop, stream, shape, include_usage), media_type="text/event-stream"
        )
    return await collect(state.loop, http, stream, shape)


def usage_of(stream: Stream) -> dict:
    return usage(stream.request.num_prompt, stream.request.num_output)


async def next_output(stream: Stream) -> StepOutput:
    item = await stream.outputs.get()
    if isinstance(item, BaseException):  # the engine loop died under this request
        raise APIError(500, f"the engine failed: {item!r}", kind="server_error")
    if item.finish_reason == "error":  # this request alone failed; the engine serves on
        raise APIError(500, f"serving this request failed: {item.error}", kind="server_error")
    return item


async def sse(loop: EngineLoop, stream: Stream, shape: ChunkShape, include_usage: bool
              ) -> AsyncIterator[str]:  # fmt: skip
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


# --- the door and the error handlers -------------------------------------------------------------


class Door:
    """ASGI middleware, before any parsing: with API keys, a request without a valid key gets
    401 (everything but /health); a body over `max_body_bytes` gets 413 -- at once when
    Content-Length says so, else as soon as the bytes read pass the limit. The body is read
    here (at most the limit) and handed to the app whole."""

    def __init__(self, app, gate: Gate, max_body_bytes: int) -> None:
        self.app, self.gate, self.max_body_bytes = app, gate, max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            if self.gate.keys is not None and scope["path"] != "/health":
                self.gate.key(headers.get("authorization"))
            length = headers.get("content-length", "")
            if length.isdigit() and int(length) > self.max_body_bytes:
                raise self.too_large()
            body = await self.read_body(receive)
        except APIError as e:
            return await e.response({"connection": "close"})(scope, receive, send)
        if body is None:
            return  # the client went away while sending
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: a disconnect, when it comes

        await self.app(scope, replay, send)

    async def read_body(self, receive) -> bytes | None:
        parts, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            if size > self.max_body_bytes:
                raise self.too_large()
            more = message.get("more_body", False)
        return b"".join(parts)

    def too_large(self) -> APIError:
        return APIError(413, f"the request body is over {self.max_body_bytes} bytes "
                        "(--max-body-bytes)", code="request_too_large")  # fmt: skip


def add_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's body, whatever raised it: ours, pydantic's, routing's (404,
    405), the body parser's (a 5000-digit integer, JSON nested 100k deep), or a bug (500)."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, e: RequestValidationError):
        return validation_error(e.errors()).response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        message = e.detail if isinstance(e.detail, str) else "invalid request"
        if e.status_code == 400:
            message = "the body could not be parsed as JSON (too deep, or a number too long?)"
        return APIError(e.status_code, message, kind=kind).response(e.headers)

    @app.exception_handler(Exception)
    async def bug(request: Request, e: Exception):
        return APIError(500, f"internal error: {e!r}", kind="server_error").response()


# --- running it ----------------------------------------------------------------------------------


class Server:
    """`minivtc serve`: uvicorn in the foreground. On SIGINT/SIGTERM it stops accepting and lets
    in-flight requests finish; after `shutdown_timeout` seconds the rest end with an error event
    (or a 500) and the process exits. `run()` returns the exit code: 1 if the engine failed."""

    def __init__(self, engine: Engine, tokenizer: Tokenizer, model_name: str, host: str,
                 port: int, shutdown_timeout: float = 30.0, **app_options) -> None:  # fmt: skip
        import uvicorn

        self.app = make_app(engine, tokenizer, model_name, on_fatal=self.fatal, **app_options)
        self.loop: EngineLoop = self.app.state.minivtc.loop
        self.shutdown_timeout = shutdown_timeout
        config = uvicorn.Config(self.app, host=host, port=port,
                                timeout_graceful_shutdown=shutdown_timeout + 5)  # fmt: skip
        self.server = uvicorn.Server(config)
        self.server.handle_exit = self.handle_exit  # type: ignore[method-assign]

    def run(self) -> int:
        self.server.run()
        return 1 if self.loop.error is not None else 0

    def handle_exit(self, sig: int, frame) -> None:
        if not self.server.should_exit:  # the first signal: start the clock
            print(f"shutting down: in-flight requests have {self.shutdown_timeout:g} s",
                  file=sys.stderr)  # fmt: skip
            timer = threading.Timer(self.shutdown_timeout, self.give_up)
            timer.daemon = True  # the process may end before it fires
            timer.start()
        uvicorn_handle_exit = type(self.server).handle_exit
        uvicorn_handle_exit(self.server, sig, frame)

    def give_up(self) -> None:
        self.loop.fail_all(f"the server shut down ({self.shutdown_timeout:g} s limit)")

    def fatal(self, error: BaseException) -> None:
        """The engine loop died: stop serving, so the process exits non-zero."""
        print(f"the engine failed beyond one request ({error!r}): exiting", file=sys.stderr)
        self.server.should_exit = True


class BackgroundServer:
    """uvicorn on a thread, on a free port: `with BackgroundServer(app) as url: ...`.

    For tests, the demo and notebooks; `minivtc serve` runs uvicorn in the foreground.
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        host, port = self.socket.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True
        )

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.socket.close()
