"""`minivtc route`: the fair dispatcher as an OpenAI-compatible HTTP gateway in front of
unmodified OpenAI-compatible backends (minivtc serve, vLLM, ...).

Owns the gateway's app (`make_gateway`) and `Gateway`, its state: the `Dispatcher` (every
tenant's queue and counter), one `Backend` per URL, the requests waiting for a binding, and an
httpx client. Follow one request: the door (`serving/middleware.py`: body size, API key) and the
server's own body rules (`serving/prompts.py`, `openai_api.check_unsupported`) refuse bad input
with the same 4xx a minivtc server gives; the prompt is counted with the gateway's tokenizer;
`Dispatcher.add` queues it (a request that fits no backend is a 400); it waits until the
dispatcher binds it to a backend with room; it is sent there with an explicit `max_tokens`
(what was reserved) and, streaming, `include_usage`; each chunk is passed on as it comes, and
charged as one output token; the final `usage` settles the charges (`Dispatcher.settle`).

Faults (`proxy.py`): a backend that answers 429 or 503, or refuses the connection, gives the
request back to the queue uncharged, and (unless 429) is skipped until its `/health` answers
200 again; one that fails mid-stream ends only the requests it was serving, each with an error
event. Requests waiting at the gateway are never lost to a backend's failure. The tenant is
the API key's (`serving/api_keys.py`), as in `minivtc serve`. `/fairness` and `/metrics` report
the fleet (`app.py`). With `--store`, one of k gateways sharing the counters and the rooms
(`member`, `fleet/fleet_member.py`; `watch_store` syncs it). README: "Fair across replicas";
Lesson 14.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator

import httpx
from fastapi.responses import JSONResponse, Response

from minivtc.fairness.scheduler import Scheduler
from minivtc.fleet.backend import Backend, Route
from minivtc.fleet.dispatcher import Dispatcher
from minivtc.fleet.fleet_member import RETRY_S, Member
from minivtc.fleet.shared_store import Row, Served
from minivtc.gateway.proxy import (
    Answered,
    Broken,
    Invalid,
    Refused,
    chunk_of,
    counts,
    error_event,
    send_once,
    send_stream,
)
from minivtc.model.tokenizer import Tokenizer
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request
from minivtc.serving.api_keys import Auth
from minivtc.serving.connections import Limits
from minivtc.serving.openai_api import APIError
from minivtc.serving.prompts import PromptLimits

__all__ = ["CHAT_ROOM", "Gateway"]

# The most room a chat without max_tokens is given here (`prompts.max_tokens_of`): `serve` gives
# it what its context leaves, but the gateway knows each backend's KV budget, not its context,
# and must book something finite that a context can hold
CHAT_ROOM = 256
# The longest a backend may go without sending a byte (a non-streamed answer comes whole at the
# end, so this is also the longest a non-streamed request may take): `minivtc route
# --backend-timeout`
BACKEND_IDLE_S = 600.0


class ShutDown(Exception):
    """The gateway is shutting down: a request still waiting or streaming ends now."""


class Gateway:
    """The state behind the routes. Only the event loop touches it: no locks."""

    def __init__(
        self,
        scheduler: Scheduler,
        backends: list[Backend],
        tokenizer: Tokenizer,
        model_name: str,
        auth: Auth,
        health_every_s: float = 1.0,
        route: Route | None = None,
        member: Member | None = None,
    ) -> None:
        # Lemma 4.3 over the fleet, after every event; one of k gateways states its own bound
        checked = scheduler.ledger.keeps_counters and member is None
        self.dispatcher = Dispatcher(scheduler, backends, route, checked, member)
        self.member = member  # sharing a store with other gateways (`fleet/fleet_member.py`)
        # What this gateway served, per client (`shared_store.Served`), under its id: the fleet's
        # row of it with a store, its own book without (`minivtc route`: host:port either way)
        self.gateway_id = member.gateway_id if member else "gateway"
        self.served = member.served if member else Served()
        self.tokenizer, self.model_name, self.auth = tokenizer, model_name, auth
        self.prompt_limits = PromptLimits.of(self.dispatcher.largest, tokenizer)
        self.health_every_s = health_every_s
        self.waiters: dict[str, asyncio.Future[Backend]] = {}  # waiting for a binding
        self.clients: dict[str, str] = {}  # request id -> its client, while it lives
        self.samples: dict[str, int] = {}  # request id -> its n, while it lives
        self.backend_idle_s = BACKEND_IDLE_S  # a backend silent this long has failed
        self.backend_headers: dict[str, str] = {}  # sent to every backend (its API key)
        self.closing: str | None = None  # why, once the gateway is shutting down (`fail_all`)
        self.limits: Limits | None = None  # the connections' (`gateway_app.make_gateway`)
        self.ids = itertools.count()
        self.counts = {"served": 0, "given_back": 0, "broken": 0}  # requests, for /metrics
        # Made on the serving loop (`app.lifespan`): clients for requests, taking turns, and one
        # for health checks, so that a crowd of streams can never starve the checks
        self.https: list[httpx.AsyncClient] = []
        self.turns = itertools.count()
        self.loop: asyncio.AbstractEventLoop | None = None  # the serving loop (`lifespan`)
        self.health_http: httpx.AsyncClient | None = None

    # --- a request's life -----------------------------------------------------------------

    @property
    def client(self) -> httpx.AsyncClient:
        """The next request client in turn (`app.backend_clients`: why several)."""
        assert self.https, "made on the serving loop at startup (`lifespan`)"
        return self.https[next(self.turns) % len(self.https)]

    def enqueue(self, client: str, prompt_tokens: int, max_tokens: int, n: int = 1) -> Request:
        """Queue a request; APIError 400 if it fits no backend (or the policy refuses it).
        `n` samples are reserved and charged as `n` requests would be: each holds the prompt
        and its own `max_tokens` on the backend, and each prefills the prompt."""
        if self.closing is not None:
            raise APIError(503, self.closing, kind="server_error")
        request_id = f"gw-{next(self.ids)}"
        params = SamplingParams(max_tokens=n * max_tokens)
        prompt = [0] * (n * prompt_tokens)
        request = Request(request_id, client, prompt, params, time.monotonic())
        if self.member is not None:  # (the fleet's lift)
            reason = self.member.add(self.dispatcher, request, request.arrival_time)
        else:
            reason = self.dispatcher.add(request, request.arrival_time)
        if reason is not None and reason.startswith("rate limit"):  # the policy's (RPM)
            raise APIError(429, reason, None, "rate_limit_exceeded", "requests")  # as the server
        if reason is not None:
            raise APIError(400, reason, "max_tokens", "context_length_exceeded")
        self.clients[request_id], self.samples[request_id] = client, n
        self.wait(request)
        return request

    def wait(self, request: Request) -> None:
        """`request` is in the queue: its waiter learns its backend when it is bound (made
        now, not when the response starts, so that no round can bind it unseen)."""
        self.waiters[request.request_id] = asyncio.get_running_loop().create_future()

    async def backend_for(self, request: Request) -> Backend:
        """Wait until the dispatcher binds `request` to a backend with room."""
        waiter = self.waiters[request.request_id]
        self.pump()
        backend = await waiter
        del self.waiters[request.request_id]
        return backend

    def pump(self) -> None:
        """The dispatcher's admission round; each bound request's waiter learns where. A waiter
        cancelled (its caller went away) but not yet ended is told nothing: its `end`, in the
        caller's `finally`, frees the room it was bound to, uncharged past what it received."""
        for request, backend in self.dispatcher.bind():
            waiter = self.waiters.get(request.request_id)
            if waiter is not None and not waiter.done():
                waiter.set_result(backend)

    async def relay(self, request: Request, send) -> AsyncIterator:
        """The retry loop both answers share: wait for a binding, send (`send(backend)` yields
        what comes back); a refusal before anything was served gives the request back,
        uncharged, and it waits again. A failure mid-request takes the backend out of service
        (a wrong answer does not: `Invalid`), and ends only this request."""
        while True:
            backend = await self.backend_for(request)
            try:
                async for item in send(backend):
                    yield item
                return
            except Refused:
                self.give_back(request, backend)
            except Invalid:
                raise
            except Broken:
                self.counts["broken"] += 1
                backend.healthy = False
                raise

    async def stream(
        self, request: Request, path: str, payload: dict, wants_usage: bool, headers: dict[str, str]
    ) -> AsyncIterator[bytes]:
        """The response's events: the backend's, passed on chunk by chunk."""
        usage: dict = {}
        send = lambda b: send_stream(self.client, b.name + path, payload, headers)  # noqa: E731
        try:
            async for line in self.relay(request, send):
                if self.closing is not None:  # (closing the stream aborts it there)
                    yield error_event(self.closing)
                    return
                if (out := self.on_line(request, line, usage, wants_usage)) is not None:
                    yield out
        except ShutDown as e:
            yield error_event(str(e))
        except Answered as e:  # the backend's own refusal: nothing served, refunded
            usage.update(prompt_tokens=0, completion_tokens=0)
            yield error_event(f"the backend refused the request: {e.body[:200]!r}")
        except Broken as e:  # it ends only what it was serving
            yield error_event(f"the backend failed: {e}")
        finally:
            self.end(request, usage)

    async def once(self, request: Request, path: str, payload: dict, headers: dict[str, str]):
        """A response not streamed: the backend's, whole."""
        usage: dict = {}

        async def send(backend: Backend) -> AsyncIterator[dict]:
            yield await send_once(self.client, backend.name + path, payload, headers)

        try:
            async for data in self.relay(request, send):
                if isinstance(data.get("usage"), dict):
                    usage.update(data["usage"])
                return JSONResponse(data)
        except ShutDown as e:
            raise APIError(503, str(e), kind="server_error") from None
        except Answered as e:  # the backend's own refusal: nothing served, refunded
            usage.update(prompt_tokens=0, completion_tokens=0)
            return Response(e.body, e.status, media_type="application/json")
        except Broken as e:  # (a wrong answer too: a 502 either way)
            raise APIError(502, f"the backend failed: {e}", kind="server_error") from None
        finally:
            self.end(request, usage)
        raise AssertionError("a relay ends with an answer or an exception")

    def on_line(self, request: Request, line: bytes, usage: dict, wants_usage: bool):
        """One event from the backend: a chunk with a choice is one output token (charged now,
        never past what was reserved); the usage chunk is kept, and passed on if asked for."""
        chunk = chunk_of(line)
        if chunk is None:
            return line + b"\n\n"  # [DONE]
        if isinstance(chunk.get("usage"), dict):
            usage.update(chunk["usage"])
        if chunk.get("choices"):
            if request.num_output < request.params.limit:
                request.output_ids.append(0)
                self.dispatcher.on_decode([request])
        elif not wants_usage:
            return None
        return line + b"\n\n"

    def give_back(self, request: Request, backend: Backend) -> None:
        """Refused before serving: back to the queue, uncharged (`Dispatcher.give_back`)."""
        self.counts["given_back"] += 1
        backend.healthy = False  # until its /health says otherwise (then `wake`)
        self.dispatcher.give_back(request)
        if self.member is not None:
            self.member.release(backend, request)
        self.wait(request)

    def end(self, request: Request, usage: dict) -> None:
        """The request is over (served, failed, or its caller went away): settle its charges
        with the backend's usage (if it can be true: else the gateway's own counts) and free
        its room; a request still waiting leaves the queue. Called from a `finally`: nothing
        here raises on what a backend sent, and the room is freed whatever happens."""
        client = self.clients.pop(request.request_id, None)
        if client is None:
            return  # ended already (`gateway_app.ClosingStream` makes sure of it)
        n = self.samples.pop(request.request_id, 1)
        self.waiters.pop(request.request_id, None)
        if request.request_id not in self.dispatcher.where:  # never bound: still in the queue
            self.dispatcher.scheduler.remove(request)
            return
        try:
            limit = request.params.limit
            told = counts(usage, n, self.dispatcher.largest, limit)
            prompt, output = told or (request.num_prompt, min(request.num_output, limit))
            self.dispatcher.settle(request, prompt, output)
            request.output_ids[:] = [0] * output  # what it received (VTC refunds nothing more)
            self.served.record(client, prompt, output)
        finally:
            backend = self.dispatcher.on_finish(request)
            if self.member is not None:
                self.member.release(backend, request)
            self.counts["served"] += 1
            self.pump()

    def served_by(self) -> dict[str, dict[str, Row]]:
        """Gateway id -> client -> (requests, input tokens, output tokens): the fleet's with a
        store, this gateway's alone without."""
        if self.member is not None:
            return self.member.served_by()
        return {self.gateway_id: self.served.rows()}

    def fail_all(self, reason: str) -> None:
        """Shutting down: refuse new requests; every request waiting for a backend ends now
        (an error event, or a 503), and every stream at its next event (an error event)."""
        self.closing = reason
        for waiter in self.waiters.values():
            if not waiter.done():
                waiter.set_exception(ShutDown(reason))

    async def watch_store(self) -> None:
        """Every tau (`--sync`): the counters, rooms and waiting shared with the other
        gateways (`Member.sync`), then a round on what changed."""
        assert self.member is not None, "with --store only"
        while True:
            # a store found down is asked again off the loop: an unreachable host would make
            # every try wait its whole timeout here, and every stream with it
            if self.member.down and not await asyncio.to_thread(self.member.store.answers):
                await asyncio.sleep(RETRY_S)
                continue
            if self.member.sync():
                self.dispatcher.wake()  # other gateways released room
            self.pump()
            await asyncio.sleep(max(self.member.next_sync - time.monotonic(), 0.001))

    # --- backends' health ------------------------------------------------------------------

    async def watch_health(self) -> None:
        """Every `health_every_s`: a backend is healthy while its /health answers 200."""
        while True:
            await asyncio.gather(*(self.check(b) for b in self.dispatcher.backends))
            self.dispatcher.wake()
            self.pump()
            await asyncio.sleep(self.health_every_s)

    async def check(self, backend: Backend) -> None:
        try:
            assert self.health_http is not None, "made at startup (`lifespan`)"
            response = await self.health_http.get(
                backend.name + "/health", headers=self.backend_headers
            )
            backend.healthy = response.status_code == 200
        except httpx.HTTPError:
            backend.healthy = False
