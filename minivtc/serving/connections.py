"""What one connection may cost the server: how much it may send, how slowly, and how many
connections there may be at once.

Owns: `Limits`, the frozen, checked options (`minivtc serve --max-body-bytes, --header-timeout,
--body-timeout, --max-connections`), and the uvicorn settings they become. Uvicorn's own
settings do what they can: `limit_concurrency` answers 503 beyond `max_connections` (uvicorn's
plain-text body), and h11 refuses a request head over 16 KiB. What uvicorn lacks is a deadline
for the head: a client that connects and trickles a header line every few seconds would hold
its connection (and a file descriptor) for ever, and uvicorn's keep-alive timeout starts only
after a response. `head_deadline_protocol` adds one. The body's deadline is the door's
(`door.py`), which reads the body. Does not own routes (`server.py`). Lesson 8.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_BODY_BYTES = 4 * 1024 * 1024  # a 2048-token prompt is ~10 kB of text: 4 MB is generous


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = MAX_BODY_BYTES  # larger bodies get 413 before parsing
    header_timeout_s: float = 10.0  # to send the request line and headers, else closed
    body_timeout_s: float = 30.0  # to send the whole body once the head has arrived, else 408
    max_connections: int = 256  # open at once (streams included); 503 beyond it

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

    def uvicorn_options(self) -> dict:
        """For `uvicorn.Config`: the connection limit, and the h11 protocol with a deadline
        for each request's head."""
        return {
            "limit_concurrency": self.max_connections,
            "http": head_deadline_protocol(self.header_timeout_s),
        }


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
