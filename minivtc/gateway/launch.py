"""Finding and starting the gateway's backends: the addresses it is given, and a free port and a
health check for the servers a demo or a benchmark starts behind it."""

from __future__ import annotations

import socket
import subprocess
import time

import httpx

from minivtc.fleet.backend import Backend


def backends_of(specs: list[str]) -> list:
    """`URL[=TOKENS]` each; a budget not given is read from the backend's /fairness."""
    backends = []
    for spec in specs:
        url, _, tokens = spec.partition("=")
        url = url.rstrip("/")
        if not tokens:
            kv = httpx.get(url + "/fairness", timeout=10).json()["kv"]
            tokens = str(kv["total_blocks"] * kv["block_size"])
        backends.append(Backend(url, int(tokens)))
    return backends


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
