"""`minivtc bench route --gateway`: what the gateway adds to a request, on loopback.

Owns the measurement: 8 stand-in backends (`standin_app`: an OpenAI-compatible server that
streams 16 one-token chunks and its usage at once, so that the time measured is HTTP and the
gateway, not a model), `minivtc route` in front of them with budgets no request waits for, and
64 concurrent streams, 512 requests, sent twice: round-robin straight to the backends, then
through the gateway. Per request, the time from sending it to its `[DONE]`: median and p99;
and requests per second over the run. Each server is its own process, as in production.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

import httpx

from minivtc.gateway.launch import free_port, wait_healthy

NUM_BACKENDS, CONCURRENCY, REQUESTS, CHUNKS = 8, 64, 512, 16
QUICK = 2, 16, 64  # `--quick`: backends, concurrency, requests (a smoke run)


def standin_app():
    """The stand-in backend (uvicorn's --factory)."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app = FastAPI()
    app.get("/health")(lambda: {"status": "ok"})

    async def completions():
        head = {"id": "cmpl-0", "object": "text_completion", "created": 0, "model": "m"}
        choice = {"index": 0, "text": "x", "logprobs": None, "finish_reason": None}
        usage = {"prompt_tokens": 4, "completion_tokens": CHUNKS, "total_tokens": 4 + CHUNKS}
        lines = [f"data: {json.dumps(head | {'choices': [choice]})}\n\n"] * CHUNKS
        lines += [f"data: {json.dumps(head | {'choices': [], 'usage': usage})}\n\n"]
        return StreamingResponse(iter([*lines, "data: [DONE]\n\n"]), media_type="text/event-stream")

    app.post("/v1/completions")(completions)
    return app


def bench_gateway(quick: bool = False) -> int:
    n_backends, concurrency, requests = QUICK if quick else (NUM_BACKENDS, CONCURRENCY, REQUESTS)
    ports = [free_port() for _ in range(n_backends + 1)]
    backends = [f"http://127.0.0.1:{p}" for p in ports[:-1]]
    gateway = f"http://127.0.0.1:{ports[-1]}"
    procs = [
        start(
            [
                "-m",
                "uvicorn",
                "--factory",
                f"{__name__}:standin_app",
                "--port",
                str(p),
                "--log-level",
                "warning",
            ]
        )
        for p in ports[:-1]
    ]
    args = ["-m", "minivtc", "route", "--port", str(ports[-1])]
    procs.append(start(args + [a for url in backends for a in ("--backend", f"{url}=1000000")]))
    try:
        for url in [*backends, gateway]:
            wait_healthy(url)
        direct = asyncio.run(load(lambda i: backends[i % n_backends], requests, concurrency))
        routed = asyncio.run(load(lambda i: gateway, requests, concurrency))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()
    print(f"{requests} streams of {CHUNKS} chunks, {concurrency} at once, {n_backends} backends")
    print(f"{'':>16} {'median ms':>10} {'p99 ms':>8} {'req/s':>7}")
    for name, (latencies, rate) in [("direct", direct), ("through gateway", routed)]:
        p99 = statistics.quantiles(latencies, n=100)[98]
        print(
            f"{name:>16} {1e3 * statistics.median(latencies):>10.1f} {1e3 * p99:>8.1f} {rate:>7.0f}"
        )
    return 0


async def load(url_of, requests: int, concurrency: int) -> tuple[list[float], float]:
    """`requests` streams, `concurrency` at a time: each one's latency, and requests per
    second."""
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        gate, latencies = asyncio.Semaphore(concurrency), []

        async def one(i: int) -> None:
            async with gate:
                start = time.perf_counter()
                body = {"prompt": "x", "max_tokens": CHUNKS, "stream": True}
                async with client.stream("POST", url_of(i) + "/v1/completions", json=body) as r:
                    async for _ in r.aiter_lines():
                        pass
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(requests)))
        return latencies, requests / (time.perf_counter() - start)


def start(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.DEVNULL)
