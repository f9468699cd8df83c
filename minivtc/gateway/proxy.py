"""One request sent to one backend over HTTP: what came back, line by line, or why not.

Owns the gateway's side of a backend conversation (httpx): `send_stream` yields a streamed
response's server-sent-event lines as they arrive (chunk by chunk: nothing is buffered past a
line), `send_once` returns a whole JSON response. The two ways a backend can fail are told
apart, because the dispatcher treats them differently:

- `Refused`: it answered 429 or 503, or the connection was refused, before serving anything:
  the request goes back to the queue, uncharged (`Dispatcher.give_back`);
- `Broken`: it failed after it began (a dropped connection, a truncated stream): the request
  ends, with an error event, charged for what it received.

Any other answer (a 4xx the backend found in the body) is `Answered`: passed to the caller as
the backend said it. An answer that is not what an OpenAI server sends (not a JSON object, or
larger than `MAX_ANSWER_BYTES`, or a stream line over `MAX_SSE_LINE_BYTES`) is `Invalid`:
the caller gets a 502, and the gateway's memory stays bounded whatever a backend sends.

Before it serves, the gateway asks its backends too: `backends_of` turns `--backend URL[=TOKENS]`
into `Backend`s, a budget not given read from the backend's `/fairness`; and whoever starts a
server to stand behind it (the fleet demo, the benchmarks) takes a `free_port` and waits for
its `/health` (`wait_healthy`). Plain Python over httpx; no FastAPI. README: "Fair across
replicas"; Lesson 14.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import AsyncIterator

import httpx

from minivtc.fleet.backend import Backend
from minivtc.serving.connections import sse_lines

__all__ = ["Answered", "Broken", "Invalid", "Refused", "backends_of", "chunk_of", "counts"]
__all__ += ["error_event", "free_port", "send_once", "send_stream", "wait_healthy"]

GIVE_BACK = {429, 503}  # a backend's "not now": the request may run elsewhere, or later
# A whole answer's most bytes: n=16 samples of 768 tokens with 20 top logprobs each are ~18 MB
MAX_ANSWER_BYTES = 32 * 1024 * 1024


class Refused(Exception):
    """The backend did not take the request: nothing was served."""


class Broken(Exception):
    """The backend failed mid-request."""


class Invalid(Broken):
    """The backend answered, but not as an OpenAI server does: the caller gets a 502."""


class Answered(Exception):
    """The backend answered with an error of the request's own (e.g. a 400)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"backend answered {status}")
        self.status, self.body = status, body


def unsendable(url: str, e: Exception) -> Answered:
    """A request httpx could not put on the wire (a header it cannot encode): our fault, not
    the backend's, so it is answered 400 at once and the backend is not marked down."""
    message = f"the request could not be sent to {url}: {e}"
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None}}
    return Answered(400, json.dumps(body).encode())


async def send_stream(
    client: httpx.AsyncClient, url: str, payload: dict, headers: dict[str, str]
) -> AsyncIterator[bytes]:
    """POST a streaming request; yield each `data: ...` line (without its newline)."""
    began = False
    try:
        async with client.stream("POST", url, json=payload, headers=headers) as response:
            if response.status_code in GIVE_BACK:
                raise Refused(f"{url} answered {response.status_code}")
            if response.status_code != 200:
                raise Answered(response.status_code, await response.aread())
            async for line in sse_lines(response.aiter_bytes()):
                if line.startswith(b"data:"):
                    began = True
                    yield line
    except (httpx.LocalProtocolError, UnicodeEncodeError) as e:
        raise unsendable(url, e) from None
    except (httpx.ConnectError, httpx.ConnectTimeout) as e:
        raise Refused(f"{url}: {e!r}") from None
    except ValueError as e:  # (sse_lines: a line without end)
        raise Broken(f"{url}: {e}") from None
    except httpx.HTTPError as e:  # read errors, a connection closed mid-stream
        if not began:
            raise Refused(f"{url}: {e!r}") from None
        raise Broken(f"{url} failed mid-stream: {type(e).__name__}") from None


async def send_once(
    client: httpx.AsyncClient, url: str, payload: dict, headers: dict[str, str]
) -> dict:
    """POST a request and return its JSON response (read at most `MAX_ANSWER_BYTES`)."""
    try:
        async with client.stream("POST", url, json=payload, headers=headers) as response:
            if response.status_code in GIVE_BACK:
                raise Refused(f"{url} answered {response.status_code}")
            body = await read_capped(response, url)
    except (httpx.LocalProtocolError, UnicodeEncodeError) as e:
        raise unsendable(url, e) from None
    except (httpx.ConnectError, httpx.ConnectTimeout) as e:
        raise Refused(f"{url}: {e!r}") from None
    except httpx.HTTPError as e:
        raise Broken(f"{url} failed: {type(e).__name__}") from None
    if response.status_code != 200:
        raise Answered(response.status_code, body)
    try:
        data = json.loads(body)
    except ValueError:
        raise Invalid(f"{url} answered 200 with a body that is not JSON") from None
    if not isinstance(data, dict):
        raise Invalid(f"{url} answered 200 with JSON that is not an object")
    return data


async def read_capped(response: httpx.Response, url: str) -> bytes:
    parts, size = [], 0
    async for part in response.aiter_bytes():
        size += len(part)
        if size > MAX_ANSWER_BYTES:
            raise Invalid(f"{url} answered with more than {MAX_ANSWER_BYTES} bytes")
        parts.append(part)
    return b"".join(parts)


def counts(usage: object, n: int, most_prompt: int, most_output: int) -> tuple[int, int] | None:
    """A backend's `usage` as (prompt tokens of all `n` samples, output tokens), if it holds
    two counts that can be true (whole numbers, at most what was reserved); else None, and the
    gateway keeps its own counts. The backend counts the prompt once for its `n` samples
    (OpenAI's usage), and each sample prefilled it: `n` times the prompt, as `serve` charges."""
    if not isinstance(usage, dict):
        return None
    prompt, output = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if type(prompt) is not int or type(output) is not int:  # (bool is an int: not a count)
        return None
    if not (0 <= n * prompt <= most_prompt and 0 <= output <= most_output):
        return None
    return n * prompt, output


def chunk_of(line: bytes) -> dict | None:
    """A `data: {...}` line's JSON; None for `data: [DONE]` or a line that is not JSON."""
    data = line[len(b"data:") :].strip()
    if data == b"[DONE]":
        return None
    try:
        chunk = json.loads(data)
    except ValueError:
        return None
    return chunk if isinstance(chunk, dict) else None


def error_event(message: str) -> bytes:
    """An OpenAI-shaped error as a stream event, then the end of the stream."""
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
    return f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()


# --- before serving: the backends it is given, a server started behind it ------------------------


def backends_of(specs: list[str], headers: dict[str, str] | None = None) -> list:
    """`URL[=TOKENS]` each; a budget not given is read from the backend's /fairness (with
    `headers`: the key the gateway presents to its backends). ValueError if it cannot be."""
    backends = []
    for spec in specs:
        url, _, tokens = spec.partition("=")
        url = url.rstrip("/")
        if not tokens:
            tokens = str(budget_of(url, headers or {}))
        if not tokens.isdigit() or int(tokens) < 1:
            raise ValueError(f"--backend {spec}: the budget must be a whole number of tokens")
        backends.append(Backend(url, int(tokens)))
    return backends


def budget_of(url: str, headers: dict[str, str]) -> int:
    """A minivtc backend's KV pool in tokens, from its /fairness."""
    advice = f"give it as --backend {url}=TOKENS, or, for a keyed backend, --backend-api-key"
    try:
        answer = httpx.get(url + "/fairness", headers=headers, timeout=10)
    except httpx.HTTPError as e:
        raise ValueError(f"cannot reach {url}/fairness ({e!r}): {advice}") from None
    try:
        kv = answer.json()["kv"]
        return int(kv["total_blocks"]) * int(kv["block_size"])
    except (ValueError, KeyError, TypeError):
        raise ValueError(
            f"{url}/fairness answered {answer.status_code} without a budget: {advice}"
        ) from None


def wait_healthy(url: str, seconds: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Until `url/health` answers 200; RuntimeError if `proc` (the server) exits first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server at {url} exited with {proc.returncode} at start")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not start")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
