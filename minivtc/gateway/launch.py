"""Finding and starting the gateway's backends: the addresses it is given, and a free port and a
health check for the servers a demo or a benchmark starts behind it."""

from __future__ import annotations

import socket
import subprocess
import time

import httpx

from minivtc.fleet.backend import Backend

__all__ = ["backends_of", "free_port", "wait_healthy"]


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
