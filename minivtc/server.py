"""The local server: an OpenAI-compatible HTTP API over the engine, with a fairness view.

Owns: the FastAPI app (`make_app`) — request schemas, error bodies, SSE streaming, `/health`,
`/metrics` (Prometheus text), `/fairness` (JSON) — and `serve` / `BackgroundServer` to run it
with uvicorn. Everything it knows about scheduling it reads from the engine; the engine runs in
`engine_loop.EngineLoop`'s thread, and this file never calls it directly. Lesson 8 uses it.

Follow one request: `completions()` validates the body (pydantic; a bad field is a 400 with an
OpenAI error body), encodes the prompt, names the client (`X-Client-Id` header, else the body's
`user`, else "default"), and `EngineLoop.add` queues it; the scheduler decides when it runs;
each step's `StepOutput` arrives on the request's queue and becomes an SSE chunk (or, when not
streaming, is collected into one response). A client that goes away is aborted at once and its
KV blocks return to the pool.

Client weights come from the server's configuration (`--client-weights`), never from requests:
a client cannot raise its own share.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from minivtc.engine import Engine, RequestRejected, StepOutput
from minivtc.engine_loop import EngineLoop, Stream
from minivtc.sampler import MAX_SEED, SamplingParams
from minivtc.tokenizer import Tokenizer

W_P, W_Q = 1.0, 2.0  # service is priced as the paper's cost: w_p * input + w_q * output
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "abort": "abort"}


# --- request bodies (OpenAI's names; unknown fields are rejected, as OpenAI does) --------------


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class Sampling(BaseModel):
    """Fields shared by both endpoints. `top_k` and `ignore_eos` are vLLM's extensions."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    stop: str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=4)] | None = (
        None
    )
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)  # 64-bit, as vLLM checks
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    ignore_eos: bool = False
    # Accepted at their defaults only (a non-default value is a clear 400, not silently ignored).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: bool | int | None = None
    logit_bias: dict[str, float] | None = None


class CompletionBody(Sampling):
    prompt: str | list[int] | list[str]
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "user", "assistant"]
    content: str
    name: str | None = None


class ChatBody(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


class APIError(Exception):
    """An error answered as OpenAI does: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status, message, param, code, kind,
        )  # fmt: skip

    def body(self) -> dict:
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        return {"error": error}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


# --- the app -----------------------------------------------------------------------------------


@dataclass
class ServerState:
    loop: EngineLoop
    tokenizer: Tokenizer
    model_name: str
    created: int


def make_app(engine: Engine, tokenizer: Tokenizer, model_name: str = "minivtc-tiny") -> FastAPI:
    """The app over `engine` (which it starts on a thread at startup and stops at shutdown)."""
    state = ServerState(EngineLoop(engine), tokenizer, model_name, int(time.time()))
    app = FastAPI(
        title="minivtc", lifespan=lifespan(state),
        description="OpenAI-compatible completions over minivtc's engine, scheduled fairly.",
    )  # fmt: skip
    app.state.minivtc = state
    add_error_handlers(app)

    @app.post("/v1/completions")
    async def completions(
        body: CompletionBody, request: Request, x_client_id: str | None = Header(None)
    ):
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "one prompt per request is supported", "prompt")
            prompt = prompt[0]
        if isinstance(prompt, list):
            vocab = tokenizer.vocab_size
            if any(not 0 <= t < vocab for t in prompt):
                raise APIError(400, f"prompt token ids must be in [0, {vocab})", "prompt")
            prompt_ids = prompt
        else:
            prompt_ids = tokenizer.encode(prompt)
        check_unsupported(body, state)
        params = sampling_params(body, body.max_tokens or 16)
        return await respond(state, request, body, prompt_ids, params, x_client_id, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(
        body: ChatBody, request: Request, x_client_id: str | None = Header(None)
    ):
        try:
            messages = [m.model_dump(exclude_none=True) for m in body.messages]
            prompt_ids = tokenizer.chat_ids(messages)
        except ValueError as e:
            raise APIError(400, str(e), "messages") from None
        check_unsupported(body, state)
        room = min(engine.max_positions, engine.allocator.num_tokens) - len(prompt_ids)
        max_tokens = body.max_completion_tokens or body.max_tokens or max(room, 1)
        params = sampling_params(body, max_tokens)
        return await respond(state, request, body, prompt_ids, params, x_client_id, chat=True)

    @app.get("/v1/models")
    async def models():
        card = {
            "id": model_name,
            "object": "model",
            "created": state.created,
            "owned_by": "minivtc",
        }
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health():
        if not state.loop.alive:
            error = {"message": f"the engine loop is not running: {state.loop.error!r}"}
            return JSONResponse({"status": "dead", **error}, status_code=503)
        return {"status": "ok"}

    @app.get("/fairness")
    async def fairness():
        """Per client: counter, weight, waiting, running, tokens and service so far."""
        return await read_between_steps(state, fairness_view)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():
        return await read_between_steps(state, prometheus_text)

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


async def read_between_steps(state: ServerState, view):
    """`view(loop)`, run on the engine thread between two steps (so it sees one state)."""
    try:
        return await state.loop.call(lambda: view(state.loop))
    except RuntimeError as e:  # the engine loop is dead
        raise APIError(503, str(e), kind="server_error") from None


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, e: RequestValidationError):
        return validation_error(e.errors()).response()


def validation_error(errors) -> APIError:
    """pydantic's first complaint as one sentence naming the field (OpenAI answers 400)."""
    if not errors:
        return APIError(400, "invalid request body")
    first = errors[0]
    if first["type"] == "json_invalid":
        return APIError(400, f"the body is not valid JSON: {first.get('msg', '')}")
    loc = [str(x) for x in first["loc"] if x != "body"]
    # A union (str | list[int] | ...) reports one error per member: name the field, not them.
    loc = [x for x in loc if x not in ("str", "int", "float", "bool") and "[" not in x]
    param = ".".join(loc) or None
    if first["type"] == "extra_forbidden":
        return APIError(400, f"Unrecognized request argument supplied: {param}", param)
    if first["type"] == "missing":
        return APIError(400, f"you must provide '{param}'", param)
    return APIError(400, f"invalid value for '{param}': {first['msg']}", param)


def check_unsupported(body: Sampling, state: ServerState) -> None:
    if body.model is not None and body.model != state.model_name:
        raise APIError(
            404, f"the model '{body.model}' does not exist; this server serves "
            f"'{state.model_name}'", "model", "model_not_found",
        )  # fmt: skip
    if body.n != 1:
        raise APIError(400, "n > 1 is not supported: send one request per completion", "n")
    # Accepted only at a value that changes nothing: anything else is refused, never ignored.
    harmless = {
        "presence_penalty": (0.0,), "frequency_penalty": (0.0,), "logprobs": (None, False, 0),
        "logit_bias": (None, {}), "echo": (False,), "best_of": (None, 1), "suffix": (None, ""),
    }  # fmt: skip
    for name, allowed in harmless.items():
        if getattr(body, name, allowed[0]) not in allowed:
            raise APIError(400, f"'{name}' is not supported by this server", name)


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
    params: SamplingParams, x_client_id: str | None, chat: bool,
):  # fmt: skip
    client_id = x_client_id or body.user or "default"
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    try:
        stream = await state.loop.add(prompt_ids, params, client_id, request_id)
    except RequestRejected as e:
        if e.kind == "rate_limited":
            raise APIError(429, e.reason, None, "rate_limit_exceeded", "requests") from None
        raise APIError(400, e.reason, e.param, "context_length_exceeded") from None
    except RuntimeError as e:  # the engine loop is dead
        raise APIError(503, str(e), kind="server_error") from None
    shape = ChunkShape(request_id, state.model_name, int(time.time()), chat)
    if body.stream:
        usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(
            sse(state.loop, stream, shape, usage), media_type="text/event-stream"
        )
    return await collect(state.loop, http, stream, shape)


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

    def choice(self, text: str, finish_reason: str | None, streaming: bool, first: bool) -> dict:
        choice: dict = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        if not self.chat:
            choice["text"] = text
        elif streaming:
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            choice["delta"] = delta if (text or first or finish_reason is None) else {}
        else:
            choice["message"] = {"role": "assistant", "content": text}
        return choice


def usage(stream: Stream) -> dict:
    r = stream.request
    return {
        "prompt_tokens": r.num_prompt, "completion_tokens": r.num_output,
        "total_tokens": r.num_tokens,
    }  # fmt: skip


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
            yield event({**shape.head(streaming=True), "choices": [], "usage": usage(stream)})
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
            "usage": usage(stream),
        }
    finally:
        if not finished:
            loop.abort(stream.request.request_id)


# --- what the server reports -------------------------------------------------------------------


def fairness_view(loop: EngineLoop) -> dict:
    """The scheduler's state per client, read between two steps (so it is consistent)."""
    engine = loop.engine
    scheduler = engine.scheduler
    counters = getattr(scheduler, "counters", {})
    weights = getattr(scheduler, "weights", {})
    waiting: dict[str, int] = {}
    for r in scheduler.waiting():
        waiting[r.client_id] = waiting.get(r.client_id, 0) + 1
    running: dict[str, int] = {}
    for r in engine.running:
        running[r.client_id] = running.get(r.client_id, 0) + 1
    clients = sorted(set(engine.client_tokens) | set(waiting) | set(counters))
    view = {}
    for c in clients:
        tokens = engine.client_tokens.get(c)
        n_in, n_out = (tokens.num_input, tokens.num_output) if tokens else (0, 0)
        view[c] = {
            "counter": counters.get(c), "weight": weights.get(c, 1.0),
            "waiting": waiting.get(c, 0), "running": running.get(c, 0),
            "input_tokens": n_in, "output_tokens": n_out, "service": W_P * n_in + W_Q * n_out,
        }  # fmt: skip
    a = engine.allocator
    return {
        "scheduler": scheduler.name,
        "kv": {
            "used_blocks": a.num_used_blocks,
            "total_blocks": a.num_blocks,
            "block_size": a.block_size,
        },  # fmt: skip
        "clients": view,
    }


def prometheus_text(loop: EngineLoop) -> str:
    view = fairness_view(loop)
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[dict, float]]) -> None:
        lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
        for labels, value in samples:
            lines.append(f"{name}{label_text(labels)} {value}")

    clients = view["clients"]

    def per_client(key: str) -> list[tuple[dict, float]]:
        return [({"client": c}, v[key]) for c, v in clients.items() if v[key] is not None]

    family("minivtc_client_input_tokens_total", "counter", "Prompt tokens processed.",
           per_client("input_tokens"))  # fmt: skip
    family("minivtc_client_output_tokens_total", "counter", "Tokens generated.",
           per_client("output_tokens"))  # fmt: skip
    family(
        "minivtc_client_service_total",
        "counter",
        "Service delivered: w_p*input + w_q*output (w_p=1, w_q=2).",
        per_client("service"),
    )
    family("minivtc_client_counter", "gauge", "VTC's virtual token counter.",
           per_client("counter"))  # fmt: skip
    family("minivtc_requests_waiting", "gauge", "Requests waiting to be admitted.",
           per_client("waiting"))  # fmt: skip
    family("minivtc_requests_running", "gauge", "Requests in the running batch.",
           per_client("running"))  # fmt: skip
    finished = [({"client": c, "reason": r}, n) for (c, r), n in sorted(loop.finished.items())]
    family("minivtc_requests_finished_total", "counter", "Requests finished, by reason.", finished)
    for name, hist, what in (
        ("minivtc_time_to_first_token_seconds", loop.ttft, "Arrival to first token."),
        ("minivtc_request_latency_seconds", loop.latency, "Arrival to last token."),
    ):
        lines.extend([f"# HELP {name} {what}", f"# TYPE {name} histogram"])
        for le, count in hist.cumulative():
            lines.append(f'{name}_bucket{{le="{le}"}} {count}')
        lines.extend([f"{name}_sum {hist.total}", f"{name}_count {hist.count}"])
    kv = view["kv"]
    family("minivtc_kv_blocks_used", "gauge", "KV blocks held by requests.",
           [({}, kv["used_blocks"])])  # fmt: skip
    family("minivtc_kv_blocks_total", "gauge", "KV blocks in the pool.", [({}, kv["total_blocks"])])
    return "\n".join(lines) + "\n"


def label_text(labels: dict) -> str:
    if not labels:
        return ""
    escape = lambda v: str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in labels.items()) + "}"


# --- running it ----------------------------------------------------------------------------------


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
