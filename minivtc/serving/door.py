"""The door every request passes before it is parsed, and how every error is answered.

Owns: `Door`, ASGI middleware that refuses a body over the size limit (413) and, with API
keys, a request without a valid key (401) before FastAPI reads anything, so a 10 MB body or a
stranger costs the event loop nothing; and `add_error_handlers`, which answers every error,
whatever raised it (ours, pydantic's, routing's 404 and 405, the body parser's, a bug), in
OpenAI's error body. Does not own who the caller is (`api_keys.py`) or routes (`server.py`).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from minivtc.serving.api_keys import Gate
from minivtc.serving.openai_api import APIError, validation_error


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
        return APIError(
            413,
            f"the request body is over {self.max_body_bytes} bytes (--max-body-bytes)",
            code="request_too_large",
        )


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
