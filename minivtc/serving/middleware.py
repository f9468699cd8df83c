"""The door every request passes before it is parsed, and how every error is answered.

Owns: `GuardMiddleware`, ASGI middleware that refuses a body over the size limit (413), a body
slow to arrive (408) and, with API keys, a request without a valid key (401) before FastAPI
reads anything, so a 10 MB body or a stranger costs the event loop nothing; and
`add_error_handlers`, which answers every error, whatever raised it (ours, pydantic's, routing's
404 and 405, a bug), in OpenAI's error body. Does not own who the caller is (`api_keys.py`), the
limits (`connections.py`) or routes (`server.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from minivtc.serving.api_keys import Auth
from minivtc.serving.connections import InFlight, Limits
from minivtc.serving.openai_api import APIError, clip, validation_error

__all__ = ["GuardMiddleware", "add_error_handlers", "is_loopback"]

DRAIN_BYTES = 64 * 1024 * 1024  # dropped after a refusal, so a client still sending can read it
# Answered without a key: a supervisor's liveness check, and the dashboard's page, which holds
# no data and asks for the key its data needs (a browser cannot send one when it opens a page)
KEYLESS_PATHS = ("/health", "/dashboard")


class GuardMiddleware:
    """ASGI middleware, before any parsing: with API keys, a request without a valid key gets
    401 (everything but `KEYLESS_PATHS`); a body over `max_body_bytes` gets 413 -- at once when
    Content-Length says so, else as soon as the bytes read pass the limit; a body that has not
    all arrived `body_timeout_s` after the head gets 408. The body is read here (at most the
    limit) and handed to the app whole.

    A refused client may still be sending its body: closing the connection then would reset
    it, and the client would see a broken connection, not the answer (and retry: the OpenAI
    SDK uploaded a 5 MB body three times). So before answering, the door reads and drops what
    is still coming, up to `DRAIN_BYTES` and within the body's deadline.

    The door also wraps the whole exchange, so what a route took of the clients' requests in
    flight (`InFlight.take`) is given back here once the response has ended, or the client
    has gone, whatever happened in between."""

    def __init__(self, app, auth: Auth, limits: Limits, in_flight: InFlight) -> None:
        self.app, self.auth, self.limits, self.in_flight = app, auth, limits, in_flight

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        body = await self.admit(scope, headers, receive)
        if isinstance(body, APIError):
            return await body.response({"connection": "close"})(scope, receive, send)
        if body is None:
            return  # the client went away while sending
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: a disconnect, when it comes

        try:
            await self.app(scope, replay, send)
        finally:
            self.in_flight.release(scope)

    async def admit(self, scope, headers: dict[str, str], receive) -> bytes | APIError | None:
        """The body, or the refusal to answer once the rest of the body is dropped (None: the
        client went away)."""
        timeout = self.limits.body_timeout_s
        try:
            if not announces_body(headers):  # (nothing can be slow: see `announces_body`)
                return await self.checked_body(scope, headers, receive)
            return await asyncio.wait_for(self.checked_body(scope, headers, receive), timeout)
        except asyncio.TimeoutError:  # (TimeoutError itself from Python 3.11)
            return APIError(408, self.too_slow(), code="request_timeout")
        except APIError as e:
            if headers.get("expect", "").lower() != "100-continue":  # else it sends no body
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(drain(receive), timeout)
            return e

    async def checked_body(self, scope, headers: dict[str, str], receive) -> bytes | None:
        """The key, the announced length, then the body (APIError: refused)."""
        if self.auth.keys is None and (refusal := browser_refusal(scope, headers)) is not None:
            raise refusal
        if self.auth.keys is not None and scope["path"] not in KEYLESS_PATHS:
            self.auth.key(headers.get("authorization"))
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.limits.max_body_bytes:
            raise self.too_large()
        return await self.read_body(receive)

    async def read_body(self, receive) -> bytes | None:
        parts, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            if size > self.limits.max_body_bytes:
                raise self.too_large()
            more = message.get("more_body", False)
        return b"".join(parts)

    def too_large(self) -> APIError:
        return APIError(
            413,
            f"the request body is over {self.limits.max_body_bytes} bytes (--max-body-bytes)",
            code="request_too_large",
        )

    def too_slow(self) -> str:
        return (
            f"the request body did not arrive within {self.limits.body_timeout_s:g} s "
            "(--body-timeout)"
        )


def announces_body(headers: dict[str, str]) -> bool:
    """Whether a body follows the head (HTTP/1.1: a Content-Length other than 0, or chunked).
    A request without one (a GET: `/health`, `/fairness`) has all arrived with its head, so the
    door reads it without the deadline, whose task costs two more turns of the event loop:
    under many streams each turn waits behind a batch of their chunks, and `/health` answers
    that much later (minivtc/bench/README.md)."""
    return headers.get("content-length", "0") != "0" or "transfer-encoding" in headers


# What a web page on another site may send without asking first (a CORS "simple" request)
SIMPLE_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]", "::1")


def browser_refusal(scope, headers: dict[str, str]) -> APIError | None:
    """Without keys, the server trusts whoever reaches it, so a web page in a browser on this
    machine must not reach it for another site: a request from loopback that names another
    Host (a DNS-rebinding page: 403), and a POST whose body is not declared JSON (a
    cross-site form or `text/plain` fetch, which a browser sends without asking: 415)."""
    client = scope.get("client")
    if client is None or not is_loopback(client[0]):
        return None
    host = headers.get("host", "")
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    if name and name not in LOOPBACK_NAMES and not name.endswith(".localhost"):
        message = f"Host {host!r} is not this server's: without keys it answers loopback names"
        return APIError(403, message, kind="permission_error", code="host_not_allowed")
    kind = headers.get("content-type", "").split(";")[0].strip().lower()
    if scope.get("method") == "POST" and kind in SIMPLE_TYPES:
        return APIError(415, "send the body as JSON: Content-Type: application/json")
    return None


def is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # not an address (a test client's "testclient")
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # 127.0.0.1 as a dual-stack socket reports it
    return address.is_loopback


async def drain(receive) -> None:
    """Read and drop the rest of a refused request's body, up to `DRAIN_BYTES`."""
    dropped = 0
    while dropped <= DRAIN_BYTES:
        message = await receive()
        dropped += len(message.get("body", b""))
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            return


def add_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's body, whatever raised it: ours (the body parser's included: a
    5000-digit integer, JSON nested 100k deep), pydantic's, routing's (404, 405), or a bug
    (500)."""

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
        return APIError(e.status_code, message, kind=kind).response(dict(e.headers or {}))

    @app.exception_handler(Exception)
    async def bug(request: Request, e: Exception):
        return APIError(500, f"internal error: {clip(repr(e))}", kind="server_error").response()
