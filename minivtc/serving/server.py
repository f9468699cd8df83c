"""The local server: an OpenAI-compatible HTTP API over the engine, with a fairness view.

Owns: the FastAPI app (`make_app`), its thin routes, and `minivtc serve`'s run of it (`Server`:
in the foreground with a shutdown time limit; uvicorn itself is run by `hosting.py`). The door
every request passes first (body size and deadline, API key) and the error answers are
`middleware.py`'s; what one connection may cost (`Limits`, and the uvicorn settings made from
them) `connections.py`'s; what a body becomes (checked body, prompt, sampling params)
`prompts.py`'s; streaming or collecting a request's outputs `streaming.py`'s; the bodies and
error shape `openai_api.py`'s; who the caller is `api_keys.py`'s; the reports
`observability.py`'s; the live page (`/dashboard`) `dashboard.py`'s. The engine runs on
`engine_loop.EngineLoop`'s thread, and nothing here touches it: handlers send the loop commands,
and read engine state only through a snapshot taken there. Lesson 9 uses it.

Follow one request: uvicorn answers 503 beyond `max_connections` and closes a connection slow
to send its head; the door refuses a body over `max_body_bytes` (413), one slow to arrive
(408) or a missing key (401) before anything is parsed; `completions()` parses and validates
the body on a worker thread (a bad field is a 400 with an OpenAI error body), names the client
(`api_keys.Auth`), tokenizes the prompt on a worker thread (a long prompt must not stall other
streams), and `EngineLoop.add` queues it; the scheduler decides when it runs; each step's
`StepOutput` arrives on the request's queue and becomes an SSE chunk (or, when not streaming,
is collected into one response). A client that goes away is aborted at once and its KV blocks
return to the pool. A fault in one request's own work ends that request alone (an error event,
or a 500); one that leaves the engine unsound ends the loop, `/health` answers 503, and
`minivtc serve` exits non-zero for a supervisor to restart it.

Client weights come from the server's configuration (the keys file or `--client-weights`), never
from requests: a client cannot raise its own share."""

from __future__ import annotations

import asyncio
import functools
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from minivtc.engine.engine import Engine
from minivtc.model import chat
from minivtc.model.tokenizer import Tokenizer
from minivtc.serving.api_keys import Auth, Caller, weights_of
from minivtc.serving.connections import InFlight, Limits
from minivtc.serving.dashboard import Setup, add_dashboard, server_data, viewer
from minivtc.serving.engine_loop import EngineLoop
from minivtc.serving.hosting import Foreground, name_os_thread
from minivtc.serving.info_routes import add_info_routes
from minivtc.serving.middleware import GuardMiddleware, add_error_handlers
from minivtc.serving.observability import fairness_view, prometheus_text
from minivtc.serving.openai_api import APIError, check_unsupported
from minivtc.serving.prompts import (
    PromptLimits,
    chat_body,
    check_fan_out,
    check_logprob_volume,
    completion_body,
    completion_inputs,
    max_tokens_of,
    off_loop_if_large,
    sampling_params,
)
from minivtc.serving.server_state import ServerState
from minivtc.serving.streaming import respond

__all__ = ["Server", "make_app"]


@dataclass(frozen=True)
class AppOptions:
    """How `make_app` sets the server up beside its engine and model: the front end's options,
    never the engine's. Which engine (policy, pool, admission, preemption, context) is the
    `EngineConfig` the engine was built from (`engine/engine_config.py`); vLLM too keeps its API
    server's arguments apart from its engine's.

    `auth`: API keys (default: none, every caller names itself: local use). `limits`: what one
    connection may cost (default `Limits()`; `Server` and `BackgroundServer` make uvicorn's
    settings from them). `on_fatal(error)`: called if the engine fails beyond one request
    (`serve` uses it to exit non-zero). `forget_every_s`: how often idle clients are forgotten.
    `aliases`: the model's other names. `chat_template`: a Jinja template (text or a file)."""

    auth: Auth | None = None
    limits: Limits | None = None
    on_fatal: Callable[[BaseException], None] | None = None
    forget_every_s: float = 10.0
    aliases: tuple[str, ...] = ()
    chat_template: str | None = None


def make_app(
    engine: Engine, tokenizer: Tokenizer, model_name: str = "minivtc-tiny", **options: Any
) -> FastAPI:
    """The app over `engine` (which it starts on a thread at startup and stops at shutdown);
    `options`: `AppOptions`' fields, by name."""
    o = AppOptions(**options)
    auth, limits = o.auth or Auth(), o.limits or Limits()
    tenants = weights_of(auth.keys) if auth.keys is not None else None  # never forgotten
    state = ServerState(
        EngineLoop(engine, on_fatal=o.on_fatal, forget_every_s=o.forget_every_s, tenants=tenants),
        tokenizer,
        model_name,
        int(time.time()),
        auth,
        PromptLimits.of(engine.max_model_len, tokenizer),
        limits,
        InFlight(limits.max_client_requests),
        tuple(o.aliases),
        chat.load_template(o.chat_template) if o.chat_template else None,
    )
    app = FastAPI(
        title="minivtc",
        lifespan=lifespan(state),
        description="OpenAI-compatible completions over minivtc's engine, scheduled fairly.",
    )
    app.state.minivtc = state
    app.state.dashboard = Setup.of(engine)  # (read now: the engine thread has not started)
    add_error_handlers(app)
    app.add_middleware(GuardMiddleware, auth=state.auth, limits=limits, in_flight=state.in_flight)
    app.post("/v1/completions")(completions)
    app.post("/v1/chat/completions")(chat_completions)
    add_info_routes(app)  # /v1/models, /v1/models/{id}, /tokenize, /detokenize, /version, /ping
    app.get("/health")(health)
    app.get("/fairness")(fairness)
    app.get("/metrics", response_class=Response)(metrics)
    add_dashboard(app, dashboard_data)  # /dashboard, /dashboard/data (`dashboard.py`)
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


async def completions(http: Request):
    state: ServerState = http.app.state.minivtc
    raw = await http.body()
    body = await off_loop_if_large(len(raw), completion_body, raw)
    caller = identify(state, http, body.user)
    check_unsupported(body, state.model_name, state.aliases)
    # every prompt checked before any is queued
    ids, echoes = await off_loop_if_large(
        len(raw), completion_inputs, state.prompt_limits, state.tokenizer, body
    )
    params = sampling_params(body, max_tokens_of(body), body.logprobs)
    check_logprob_volume(len(ids) * params.n, params.limit, body.logprobs)
    state.in_flight.take(http.scope, caller.client, len(ids) * params.n)  # else 429
    return await respond(state, http, body, ids, params, caller, False, echoes)


async def chat_completions(http: Request):
    state: ServerState = http.app.state.minivtc
    raw = await http.body()
    body = await off_loop_if_large(len(raw), chat_body, state.prompt_limits, raw)
    caller = identify(state, http, body.user)
    check_unsupported(body, state.model_name, state.aliases)
    check_fan_out(body.n)
    messages = [{"role": m.role, "content": m.text} for m in body.messages]
    try:
        prompt_ids = await render(state, messages)
    except ValueError as e:  # (the template refused them)
        raise APIError(400, str(e), "messages") from None
    room = state.prompt_limits.tokens - len(prompt_ids)  # (`Engine.max_model_len`'s)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    params = sampling_params(body, max_tokens_of(body, room), logprobs)
    check_logprob_volume(params.n, params.limit, logprobs)
    state.in_flight.take(http.scope, caller.client, params.n)  # else 429
    return await respond(state, http, body, [prompt_ids], params, caller, True)


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
    caller = viewer(state.auth, http)  # (without keys: loopback only, as the dashboard's)
    snap = await snapshot(state)
    return await asyncio.to_thread(fairness_view, snap, None if caller.admin else caller.client)


async def dashboard_data(http: Request):
    """What `/dashboard` draws: `/fairness`'s view for the caller and more (`dashboard.py`).
    Without keys, for callers on loopback only."""
    state: ServerState = http.app.state.minivtc
    caller = viewer(state.auth, http)
    snap = await snapshot(state)
    return await asyncio.to_thread(server_data, snap, http.app.state.dashboard, caller)


async def metrics(http: Request):
    """Prometheus text. With API keys, for admin keys only."""
    state: ServerState = http.app.state.minivtc
    if not viewer(state.auth, http).admin:  # (without keys: loopback only)
        raise APIError(403, "/metrics needs an admin key", kind="permission_error")
    snap = await snapshot(state)
    text = await asyncio.to_thread(prometheus_text, snap, model_name=state.model_name)
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


# --- helpers -------------------------------------------------------------------------------------


async def render(state: ServerState, messages: list[dict]) -> list[int]:
    """A chat's prompt ids, off the event loop; a chat template renders on workers of its own
    (`ServerState.renders`), so a slow one never holds the workers that parse `/v1` bodies."""
    limit = state.prompt_limits.max_chars
    work = functools.partial(
        chat.prompt_ids, state.tokenizer, messages, state.chat_template, max_chars=limit
    )
    if state.chat_template is None:
        return await asyncio.to_thread(work)
    return await asyncio.get_running_loop().run_in_executor(state.renders, work)


def identify(state: ServerState, http: Request, user: str | None) -> Caller:
    headers = http.headers
    return state.auth.caller(headers.get("authorization"), headers.get("x-client-id"), user)


async def snapshot(state: ServerState):
    """The engine's state for a report, copied on the loop thread between two steps."""
    try:
        return await state.loop.call(state.loop.snapshot)
    except RuntimeError as e:  # the engine loop is dead
        raise APIError(503, str(e), kind="server_error") from None


# --- running it ----------------------------------------------------------------------------------


class Server:
    """`minivtc serve`: the engine loop on the calling thread, the one that loaded the model
    (`EngineLoop.hold`), and uvicorn (`Foreground`) on a thread beside it. On SIGINT/SIGTERM it
    stops accepting and lets in-flight requests finish; after `shutdown_timeout` seconds the
    rest end with an error event (or a 500) and the process exits. `run()` returns the exit
    code: 1 if the engine failed or uvicorn could not start."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Tokenizer,
        model_name: str,
        host: str,
        port: int,
        shutdown_timeout: float = 30.0,
        **app_options,
    ) -> None:
        self.app = make_app(engine, tokenizer, model_name, on_fatal=self.fatal, **app_options)
        self.loop: EngineLoop = self.app.state.minivtc.loop.hold()
        self.shutdown_timeout = shutdown_timeout
        self.foreground = Foreground(self.app, host, port, shutdown_timeout, self.give_up)
        self.server = self.foreground.server  # uvicorn's
        self.http_failed = False

    def run(self) -> int:
        """Serve until a signal, or the engine's failure, ends it. Python delivers signals to
        the main thread and uvicorn installs its handlers only there, so on the main thread
        `run` installs them (and puts the previous ones back when it returns)."""
        on_main = threading.current_thread() is threading.main_thread()
        signals = (signal.SIGINT, signal.SIGTERM) if on_main else ()
        previous = {sig: signal.signal(sig, self.foreground.handle_exit) for sig in signals}
        http = threading.Thread(target=self.serve_http, name="minivtc-http")
        try:
            http.start()
            self.loop.run()
            http.join()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 1 if self.loop.error is not None or self.http_failed else 0

    def serve_http(self) -> None:
        """uvicorn, until it exits; then the engine loop ends too (at the latest: the app's
        shutdown stops it first). uvicorn exits with SystemExit when it cannot start."""
        name_os_thread("minivtc-http")
        try:
            self.foreground.run()
        except SystemExit as e:
            self.http_failed = e.code not in (0, None)
        finally:
            self.loop.stop()

    def give_up(self) -> None:
        self.loop.fail_all(f"the server shut down ({self.shutdown_timeout:g} s limit)")

    def fatal(self, error: BaseException) -> None:
        """The engine loop died: stop serving, so the process exits non-zero."""
        print(f"the engine failed beyond one request ({error!r}): exiting", file=sys.stderr)
        self.server.should_exit = True
