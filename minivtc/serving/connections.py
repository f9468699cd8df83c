"""What one connection, and one client, may cost the server: how much it may send, how slowly,
how many connections there may be at once, and how many requests one client may have in flight.

Owns: `Limits`, the frozen, checked options (`minivtc serve --max-body-bytes, --header-timeout,
--body-timeout, --max-connections, --max-client-requests`), the uvicorn settings they become,
and `InFlight`, each client's count of requests in flight. Uvicorn's own settings do what they
can: `limit_concurrency` answers 503 beyond `max_connections` (uvicorn's plain-text body), and
h11 refuses a request head over 16 KiB. What uvicorn lacks is a deadline for the head: a client
that connects and trickles a header line every few seconds would hold its connection (and a
file descriptor) for ever, and uvicorn's keep-alive timeout starts only after a response.
`head_deadline_protocol` adds one. The body's deadline is the door's (`middleware.py`), which reads
the body. Also `sse_lines`: a server-sent-event stream read with a cap on a line's bytes (the
gateway reading its backends, the load generator its server). Does not own routes (`server.py`).
Lesson 9.

Why a limit per client as well as in total: the connection cap is global, so a client whose
requests wait (under VTC, the one that sends too much) could fill every connection and the
server would refuse everyone, the fair scheduler's isolation undone one layer up. With
`max_client_requests` that client gets 429 for its own new requests once it holds its share,
and everyone else is still admitted; the global cap sits far above what one client may hold.
"""

from __future__ import annotations

import asyncio
import math
import resource
from collections import Counter
from collections.abc import AsyncIterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from minivtc.serving.openai_api import APIError

__all__ = ["InFlight", "Limits", "MAX_SSE_LINE_BYTES", "allow_open_files", "sse_lines"]

MAX_BODY_BYTES = 4 * 1024 * 1024  # a 2048-token prompt is ~10 kB of text: 4 MB is generous
HELD = "minivtc.held"  # the ASGI scope's key for what one HTTP request holds of `InFlight`


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = MAX_BODY_BYTES  # larger bodies get 413 before parsing
    header_timeout_s: float = 10.0  # to send the request line and headers, else closed
    body_timeout_s: float = 30.0  # to send the whole body once the head has arrived, else 408
    max_connections: int = 1024  # open at once (streams included); 503 beyond it
    # A client's requests queued or running at once (each of `n` completions counts); 429
    # beyond it. 16 clients at their limit fill the connection cap.
    max_client_requests: int = 64

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ValueError(f"--max-body-bytes must be >= 1024, not {self.max_body_bytes}")
        for flag, seconds in (
            ("--header-timeout", self.header_timeout_s),
            ("--body-timeout", self.body_timeout_s),
        ):
            if not 0 < seconds < math.inf:
                raise ValueError(f"{flag} must be seconds > 0 (and finite), not {seconds}")
        if self.max_connections < 1:
            raise ValueError(f"--max-connections must be >= 1, not {self.max_connections}")
        if self.max_client_requests < 1:
            raise ValueError(f"--max-client-requests must be >= 1, not {self.max_client_requests}")

    def uvicorn_options(self) -> dict:
        """For `uvicorn.Config`: the connection limit, and the h11 protocol with a deadline
        for each request's head."""
        return {
            "limit_concurrency": self.max_connections,
            "http": head_deadline_protocol(self.header_timeout_s),
        }


@dataclass
class InFlight:
    """Each client's requests in flight (queued or running), held against `limit`. Used on the
    event loop only (no lock). A route `take`s before it queues; the door (`middleware.py`), which
    wraps the whole HTTP exchange, `release`s when the response has ended or the client has
    gone, whatever happened in between, so nothing a request holds can leak."""

    limit: int
    held: Counter[str] = field(default_factory=Counter)

    def take(self, scope: MutableMapping[str, Any], client: str, n: int = 1) -> None:
        """Hold `n` requests for `client` until this HTTP exchange ends, or refuse with 429."""
        if self.held[client] + n > self.limit:
            raise APIError(
                429,
                f"client {client!r} has {self.held[client]} requests in flight and asks for "
                f"{n} more: one client may have {self.limit} queued or running at once "
                "(--max-client-requests); retry when one finishes",
                None,
                "too_many_requests_in_flight",
                "requests",
            )
        self.held[client] += n
        scope.setdefault(HELD, []).append((client, n))

    def release(self, scope: dict) -> None:
        for client, n in scope.pop(HELD, ()):
            self.held[client] -= n
            if self.held[client] <= 0:
                del self.held[client]


def allow_open_files(limits: Limits) -> None:
    """Raise this process's soft limit on open files (often 1024) towards the hard limit, so
    that `max_connections` connections, each a file, can be open at once (vLLM does the same)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = limits.max_connections + 256  # the model's files, logs, the engine's own
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def head_deadline_protocol(seconds: float) -> type[H11Protocol]:
    """Uvicorn's h11 protocol, except that a connection that has not sent a request's whole
    head `seconds` after it opened (or after its last response) is closed."""

    class HeadDeadline(H11Protocol):
        deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.start_clock()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # a request's head has arrived
                self.stop_clock()

        def on_response_complete(self) -> None:
            super().on_response_complete()  # (may start a pipelined request already here)
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.start_clock()

        def connection_lost(self, exc) -> None:
            self.stop_clock()
            super().connection_lost(exc)

        def start_clock(self) -> None:
            self.stop_clock()
            self.deadline = self.loop.call_later(seconds, self.transport.close)

        def stop_clock(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

    return HeadDeadline


# An SSE line's most bytes: a chunk with 20 top logprobs of a long token is well under 100 kB
MAX_SSE_LINE_BYTES = 1024 * 1024


async def sse_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A server-sent-event stream's lines, without their ends, from its bytes as they come.

    Split at b"\n" (a CRLF's "\r" dropped) and nowhere else: a backend writing raw UTF-8 (vLLM
    does) may put U+2028 or U+0085 inside a chunk's text, which `str.splitlines`, and so
    httpx's `aiter_lines`, would take for line ends and cut the chunk in two. A line longer
    than `MAX_SSE_LINE_BYTES` raises ValueError rather than growing without bound."""
    pending = b""
    async for part in chunks:
        pending += part
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.removesuffix(b"\r")
        if len(pending) > MAX_SSE_LINE_BYTES:
            raise ValueError(f"a stream line over {MAX_SSE_LINE_BYTES} bytes")
    if pending:
        yield pending.removesuffix(b"\r")
