"""The gateway's HTTP face: its FastAPI app and thin routes, and its reports.

Owns `make_gateway` (the app over a `Gateway`, `gateway.py`), the routes (`/v1/completions`,
`/v1/chat/completions`, `/v1/models`, `/health`, `/fairness`, `/metrics`, and the dashboard's
`/dashboard/data`: its page is `serving/dashboard.py`'s) and what they say about the fleet:
each client's counter, weight and requests waiting and running at the gateway, each backend's
budget, reservation and health, the bound, and which gateway served what (`served`: per
gateway id, per client, requests and input and output tokens; `shared_store.Served`). The body
rules are the server's own (`serving/prompts.py`, `serving/openai_api.py`), the door the
server's (`serving/middleware.py`), the callers the server's (`serving/api_keys.py`).
README: "Fair across replicas"; Lesson 14.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CollectorRegistry, generate_latest

from minivtc.fleet.shared_store import as_json
from minivtc.gateway.fleet_metrics import FleetCollector
from minivtc.gateway.gateway import CHAT_ROOM, Gateway
from minivtc.model import chat
from minivtc.serving.api_keys import Caller
from minivtc.serving.connections import InFlight, Limits
from minivtc.serving.dashboard import EVERY_S, add_dashboard, spread_view, viewer
from minivtc.serving.middleware import GuardMiddleware, add_error_handlers
from minivtc.serving.openai_api import APIError, check_unsupported
from minivtc.serving.prompts import (
    chat_body,
    check_fan_out,
    check_length,
    completion_body,
    max_tokens_of,
    off_loop_if_large,
)

__all__ = ["REQUEST_CLIENTS", "backend_clients", "make_gateway"]


def make_gateway(gateway: Gateway, limits: Limits | None = None) -> FastAPI:
    """The app; it opens its httpx client and starts health checks at startup."""
    app = FastAPI(title="minivtc route", lifespan=lifespan(gateway))
    app.state.gateway = gateway
    app.state.minivtc = gateway  # (`BackgroundServer` reads `limits` there)
    gateway.limits = limits = limits or Limits()
    app.state.in_flight = InFlight(limits.max_client_requests)  # each client's, as `serve`'s
    add_error_handlers(app)
    app.add_middleware(
        GuardMiddleware, auth=gateway.auth, limits=limits, in_flight=app.state.in_flight
    )
    app.post("/v1/completions")(completions)
    app.post("/v1/chat/completions")(chat_completions)
    app.get("/v1/models")(models)
    app.get("/health")(health)
    app.get("/fairness")(fairness)
    app.get("/metrics", response_class=Response)(metrics)
    app.state.started = time.time()  # (the dashboard starts afresh on a new gateway)
    add_dashboard(app, dashboard_data)  # /dashboard, /dashboard/data (`serving/dashboard.py`)
    return app


# Request clients taking turns: 200 streams make pools of about 12 connections each
REQUEST_CLIENTS = 16


def lifespan(gateway: Gateway):
    @asynccontextmanager
    async def run(app: FastAPI):
        gateway.https, gateway.health_http = backend_clients(
            len(gateway.dispatcher.backends), gateway.backend_idle_s
        )
        gateway.loop = asyncio.get_running_loop()  # (`fail_all` is called onto it at shutdown)
        health = asyncio.create_task(gateway.watch_health())
        shared = asyncio.create_task(gateway.watch_store()) if gateway.member else None
        try:
            yield
        finally:
            health.cancel()
            if shared is not None:
                shared.cancel()
            for client in gateway.https:
                await client.aclose()
            await gateway.health_http.aclose()

    return run


def backend_clients(
    num_backends: int, idle_s: float
) -> tuple[list[httpx.AsyncClient], httpx.AsyncClient]:
    """The gateway's HTTP clients. Requests: `REQUEST_CLIENTS` clients taking turns, each with
    no cap on connections, since the dispatcher already holds no more in flight than the
    backends' budgets take (httpx's default cap of 100, shared with the health checks, made 150
    streams wait and every backend look dead). Several, not one: httpcore walks every
    connection of a pool each time a response closes, so one pool of n streams costs n walks
    of n connections on the event loop (`/health` stalled behind them); a
    backend that sends nothing for `idle_s` is given up on, so a request's room is never held
    for ever. Health checks: their own small pool, 2 s in all. All share one TLS context:
    each makes its own otherwise, reading the CA bundle on the event loop."""
    tls = httpx.create_ssl_context()
    requests = [
        httpx.AsyncClient(
            verify=tls,
            timeout=httpx.Timeout(idle_s, connect=2.0, pool=None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=16),
        )
        for _ in range(REQUEST_CLIENTS)
    ]
    checks = httpx.AsyncClient(
        verify=tls, timeout=2.0, limits=httpx.Limits(max_connections=2 * num_backends + 2)
    )
    return requests, checks


# --- routes --------------------------------------------------------------------------------------


async def completions(http: HTTPRequest):
    gateway: Gateway = http.app.state.gateway
    raw = await http.body()
    body = await off_loop_if_large(len(raw), completion_body, raw)
    caller = identify(gateway, http, body.user)
    check_unsupported(body, gateway.model_name)
    check_fan_out(body.n)
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise APIError(400, "one prompt per request is supported", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, list):
        num_prompt = len(prompt)
    else:
        check_length(gateway.prompt_limits, len(prompt), "prompt")
        num_prompt = len(await off_loop_if_large(len(raw), gateway.tokenizer.encode, prompt))
    payload = body.model_dump(exclude_unset=True) | {"max_tokens": max_tokens_of(body)}
    http.app.state.in_flight.take(http.scope, caller.client, body.n)  # else 429
    return await forward(http, "/v1/completions", caller.client, num_prompt, payload)


async def chat_completions(http: HTTPRequest):
    gateway: Gateway = http.app.state.gateway
    raw = await http.body()
    body = await off_loop_if_large(len(raw), chat_body, gateway.prompt_limits, raw)
    caller = identify(gateway, http, body.user)
    check_unsupported(body, gateway.model_name)
    check_fan_out(body.n)
    # As `serve` reads them: a developer message is a system one, text parts are joined
    messages = [{"role": m.role, "content": m.text} for m in body.messages]
    try:
        ids = await off_loop_if_large(len(raw), chat.prompt_ids, gateway.tokenizer, messages)
        num_prompt = len(ids)
    except ValueError as e:  # (the chat format refused them)
        raise APIError(400, str(e), "messages") from None
    room = min(gateway.prompt_limits.tokens - num_prompt, CHAT_ROOM)  # (`CHAT_ROOM`: why)
    payload = body.model_dump(exclude_unset=True, exclude={"max_completion_tokens"})
    payload["max_tokens"] = max_tokens_of(body, room)
    http.app.state.in_flight.take(http.scope, caller.client, body.n)  # else 429
    return await forward(http, "/v1/chat/completions", caller.client, num_prompt, payload)


async def forward(http: HTTPRequest, path: str, client: str, num_prompt: int, payload: dict):
    """Queue the request; answer with the backend's stream or response once it is bound."""
    gateway: Gateway = http.app.state.gateway
    request = gateway.enqueue(client, num_prompt, payload["max_tokens"], payload.get("n") or 1)
    # The client in the body's `user`, not a header: JSON carries any name ("Zoë"), a header
    # only Latin-1 (the backend's own view; it never queues)
    payload["user"], headers = client, dict(gateway.backend_headers)
    if not payload.get("stream"):
        return await unless_gone(http, gateway.once(request, path, payload, headers))
    wants_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
    # The gateway settles with the usage; the caller's other options (vLLM's
    # continuous_usage_stats) go on to the backend
    payload["stream_options"] = (payload.get("stream_options") or {}) | {"include_usage": True}
    events = gateway.stream(request, path, payload, wants_usage, headers)
    return ClosingStream(events, lambda: gateway.end(request, {}))


async def unless_gone(http: HTTPRequest, answer: Awaitable[Response]) -> Response:
    """`answer`, unless the caller goes away first: then it is cancelled at once, and its
    `finally` takes the request out of the queue (or, bound, closes the backend's connection,
    which aborts it there), so nobody serves a request whose caller has left."""
    work = asyncio.ensure_future(answer)
    gone = asyncio.ensure_future(disconnected(http))
    await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    if work.done():
        gone.cancel()
        return work.result()
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError, APIError):
        await work
    return Response(status_code=499)  # (nobody reads it: the caller has gone)


async def disconnected(http: HTTPRequest) -> None:
    """Returns when the caller has closed its connection (the body was read before)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


class ClosingStream(StreamingResponse):
    """A stream whose request is ended however the response ends. A caller gone before the
    first event may leave the events' generator never started, and its own `finally` (which
    ends the request) would never run: the request would wait, or hold its room, forever."""

    def __init__(self, events, on_close) -> None:
        super().__init__(events, media_type="text/event-stream")
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()  # a no-op when the events' own `finally` has ended it


async def models(http: HTTPRequest):
    gateway: Gateway = http.app.state.gateway
    card = {"id": gateway.model_name, "object": "model", "owned_by": "minivtc"}
    return {"object": "list", "data": [card]}


async def health(http: HTTPRequest):
    """200 while some backend is healthy: the gateway can serve."""
    gateway: Gateway = http.app.state.gateway
    if not any(b.healthy for b in gateway.dispatcher.backends):
        return Response('{"status": "no healthy backend"}', 503, media_type="application/json")
    if gateway.member is not None and gateway.member.down is not None:  # serving on, alone
        return {"status": "ok", "store": f"down, serving on own counters: {gateway.member.down}"}
    return {"status": "ok"}


async def fairness(http: HTTPRequest):
    """The fleet's view; with API keys, a non-admin key sees only its own client's row."""
    gateway: Gateway = http.app.state.gateway
    return view_for(fleet_view(gateway), viewer(gateway.auth, http))


async def dashboard_data(http: HTTPRequest):
    """What `/dashboard` draws at the gateway: `/fairness`'s view for the caller, and for an
    admin the waiting counters' spread under Lemma 4.3's U with M the fleet's memory.
    Without keys, for callers on loopback only."""
    gateway: Gateway = http.app.state.gateway
    caller = viewer(gateway.auth, http)
    view = view_for(fleet_view(gateway), caller)
    data = {"kind": "gateway", "started": http.app.state.started, "time": time.monotonic()}
    data |= {"every_s": EVERY_S, **view}
    if caller.admin:
        check = gateway.dispatcher.fairness  # (the VTC family's; None for another policy)
        bound = None if check is None else check.bound
        name = FLEET_U if check else f"{view['scheduler']} keeps no counters: no spread to bound"
        data["fairness"] = spread_view(view["clients"], bound, name)
    return data


async def metrics(http: HTTPRequest):
    gateway: Gateway = http.app.state.gateway
    if not viewer(gateway.auth, http).admin:  # (without keys: loopback only)
        raise APIError(403, "/metrics needs an admin key", kind="permission_error")
    registry = CollectorRegistry()
    registry.register(FleetCollector(lambda: fleet_view(gateway)))
    return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")


# --- reports -------------------------------------------------------------------------------------


def identify(gateway: Gateway, http: HTTPRequest, user: str | None):
    return gateway.auth.caller(
        http.headers.get("authorization"), http.headers.get("x-client-id"), user
    )


FLEET_U = "U = max(w_p L_input, w_q M), w_p <= w_q, M the backends' budgets (Lemma 4.3, fleet)"


def view_for(view: dict, caller: Caller) -> dict:
    """`/fairness`'s rule: an admin sees the whole fleet, any other key its own row only."""
    if not caller.admin:  # (nor the fleet's totals: `serve` hides its totals from tenants)
        view["clients"] = {c: r for c, r in view["clients"].items() if c == caller.client}
        view["served"] = {
            g: {c: row for c, row in rows.items() if c == caller.client}
            for g, rows in view["served"].items()
        }
        del view["backends"], view["requests"]
        if view.get("fleet"):  # (other tenants' names)
            del view["fleet"]["waiting_elsewhere"]
    return view


def fleet_view(gateway: Gateway) -> dict:
    d = gateway.dispatcher
    waiting: dict[str, int] = {}
    for r in d.scheduler.waiting():
        waiting[r.client_id] = waiting.get(r.client_id, 0) + 1
    running: dict[str, int] = {}
    for backend in d.backends:
        for request_id in backend.requests:
            client = gateway.clients.get(request_id, "?")
            running[client] = running.get(client, 0) + 1
    clients = {
        c: {"counter": n, "weight": w, "waiting": waiting.get(c, 0), "running": running.get(c, 0)}
        for c, (n, w) in d.scheduler.ledger.accounts().items()
    }
    backends = [
        {
            "url": b.name,
            "budget": b.budget,
            "reserved": b.reserved,
            "healthy": b.healthy,
            "running": len(b.requests),
            "served": b.served,
        }
        for b in d.backends
    ]
    fleet = gateway.member.view() if gateway.member else None
    return {
        "scheduler": d.scheduler.name,
        "gateway": gateway.gateway_id,
        # which gateway served what: gateway id -> client -> requests, input and output tokens
        "served": {g: as_json(rows) for g, rows in sorted(gateway.served_by().items())},
        "bound": fleet["bound"] if fleet else d.gap_bound(),
        "fleet": fleet,  # with --store: this gateway among the others (`fleet_member.py`)
        "clients": clients,
        "backends": backends,
        "requests": dict(gateway.counts),
    }
