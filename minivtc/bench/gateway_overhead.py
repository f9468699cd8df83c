"""`minivtc bench route --gateway`: what the gateway adds to a request, on loopback; with
`--streams N`, how the gateway holds a class's load.

Owns the measurement: 8 stand-in backends (`standin_app`: an OpenAI-compatible server that
streams 16 one-token chunks and its usage, `--chunk-rate` chunks a second, default 20, as a
model decodes; 0: all at once, so that the time measured is HTTP and the gateway alone, its
capacity), `minivtc route` in front of them with budgets no request waits for, and 64
concurrent streams, 512 requests, sent straight to the backends (round-robin) and through the
gateway in turn, `--repeat` rounds (default 2). Per request, the time from sending it to its
`[DONE]`: median and p99; requests per second over each pass; what the gateway added at the
median (its median minus direct's, per round) and its throughput over direct's; and
`/health` probed every 50 ms by a process of its own while the gateway serves. Each server is
its own process, as in production.

`--streams N` (`bench_class_load`): N streams held open at once through the gateway over two
stand-in backends that send each of their 3 chunks `SLOW_S` apart (a class asking at once),
`/health` probed every 50 ms by a process of its own (so the probe's timings are the gateway's,
not the load generator's), and one request of a light tenant sent while they are all queued or
streaming: how many streams were served, `/health`'s median and worst, the light tenant's time
to its first token (at least `SLOW_S`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

from minivtc.gateway.proxy import free_port, wait_healthy

__all__ = ["BUDGET", "bench_class_load", "bench_gateway", "start_backends", "start_route", "stop"]

NUM_BACKENDS, CONCURRENCY, REQUESTS, CHUNKS = 8, 64, 512, 16
QUICK = 2, 16, 64  # `--quick`: backends, concurrency, requests (a smoke run)
SLOW_S, SLOW_CHUNKS = 0.5, 3  # `--streams`: a stand-in's chunks, each after SLOW_S
BUDGET = 10**9  # tokens per backend: no request waits for room (each still books and releases)


def standin_app():
    """The stand-in backend (uvicorn's --factory): CHUNKS one-token chunks and the usage at
    once; with MINIVTC_STANDIN_DELAY_S set (`--streams`), SLOW_CHUNKS chunks that far apart, so
    that every stream stays open a while; MINIVTC_STANDIN_CHUNKS sets their number
    (`bench gateways`)."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app = FastAPI()
    app.get("/health")(lambda: {"status": "ok"})

    delay = float(os.environ.get("MINIVTC_STANDIN_DELAY_S", "0"))

    chunks = int(os.environ.get("MINIVTC_STANDIN_CHUNKS", SLOW_CHUNKS if delay else CHUNKS))

    async def completions():
        head = {"id": "cmpl-0", "object": "text_completion", "created": 0, "model": "m"}
        choice = {"index": 0, "text": "x", "logprobs": None, "finish_reason": None}
        usage = {"prompt_tokens": 4, "completion_tokens": chunks, "total_tokens": 4 + chunks}

        async def lines():
            for _ in range(chunks):
                if delay:
                    await asyncio.sleep(delay)
                yield f"data: {json.dumps(head | {'choices': [choice]})}\n\n"
            yield f"data: {json.dumps(head | {'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n"

        return StreamingResponse(lines(), media_type="text/event-stream")

    app.post("/v1/completions")(completions)
    return app


def start_backends(
    n: int, delay: float = 0.0, chunks: int | None = None
) -> tuple[list[str], list[subprocess.Popen]]:
    """`n` stand-in backends, each a uvicorn process: their URLs and processes."""
    ports = [free_port() for _ in range(n)]
    app = ["-m", "uvicorn", "--factory", f"{__name__}:standin_app", "--log-level", "warning"]
    env = {"MINIVTC_STANDIN_DELAY_S": str(delay)}
    if chunks is not None:
        env["MINIVTC_STANDIN_CHUNKS"] = str(chunks)
    procs = [start([*app, "--port", str(p)], env) for p in ports]
    return [f"http://127.0.0.1:{p}" for p in ports], procs


def bench_class_load(streams: int) -> int:
    """`--streams`: the module docstring says what; prints one line per figure."""
    keys = {
        "sk-proxy-bench": {"client": "proxy", "proxy": True},
        "sk-light-bench": {"client": "light"},
    }
    backends, procs = start_backends(2, SLOW_S)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(keys, f)
    gateway, route = start_route(backends, "--api-keys", f.name)
    procs.append(route)
    try:
        for url in [*backends, gateway]:
            wait_healthy(url)
        probe = subprocess.Popen(
            [sys.executable, "-c", f"from {__name__} import probe; probe({gateway!r})"],
            stdout=subprocess.PIPE,
            text=True,
        )
        served, light_ttft = asyncio.run(class_load(gateway, streams))
        probe.terminate()
        health = json.loads(probe.communicate()[0])
    finally:
        os.unlink(f.name)
        stop(procs)
    ms = sorted(1e3 * t for t in health["seconds"])
    print(f"{streams} streams at once through `minivtc route`, 2 stand-in backends ({SLOW_S} s)")
    print(f"served: {served}/{streams}")
    print(
        f"/health from its own process: {len(ms)} probes, codes {sorted(set(health['codes']))}, "
        f"median {statistics.median(ms):.0f} ms, worst {ms[-1]:.0f} ms"
    )
    print(
        f"a light tenant's first token: {1e3 * light_ttft:.0f} ms (the backend waits "
        f"{1e3 * SLOW_S:.0f})"
    )
    return 0 if served == streams else 1


async def class_load(gateway: str, streams: int) -> tuple[int, float]:
    """`streams` streams at once (20 clients through a proxy key), then, 0.3 s in, one light
    tenant's: how many streams brought all their tokens, and the light one's first-token time."""
    limits = httpx.Limits(max_connections=None)
    async with httpx.AsyncClient(base_url=gateway, limits=limits, timeout=120) as client:

        async def one(key: str, user: str) -> tuple[bool, float]:
            body = {"prompt": "x", "max_tokens": SLOW_CHUNKS, "stream": True, "user": user}
            start, first, tokens = time.perf_counter(), None, 0
            headers = {"authorization": f"Bearer {key}"}
            async with client.stream("POST", "/v1/completions", json=body, headers=headers) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {") and json.loads(line[6:]).get("choices"):
                        first = first or time.perf_counter() - start
                        tokens += 1
            return tokens == SLOW_CHUNKS, first or float("inf")

        heavy = [asyncio.create_task(one("sk-proxy-bench", f"s{k % 20}")) for k in range(streams)]
        await asyncio.sleep(0.3)
        _, light_ttft = await one("sk-light-bench", "light")
        return sum(ok for ok, _ in await asyncio.gather(*heavy)), light_ttft


def probe(url: str) -> None:
    """GET /health every 50 ms until SIGTERM; then print the timings and codes as JSON."""
    seconds: list[float] = []
    codes: list[int] = []

    def report(*_) -> None:
        print(json.dumps({"seconds": seconds, "codes": codes}), flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, report)
    with httpx.Client(base_url=url, timeout=30) as client:
        while True:
            start = time.perf_counter()
            codes.append(client.get("/health").status_code)
            seconds.append(time.perf_counter() - start)
            time.sleep(0.05)


def bench_gateway(quick: bool = False, chunk_rate: float = 20.0, rounds: int = 2) -> int:
    """The module docstring says what; prints a table and the gateway's cost."""
    n_backends, concurrency, requests = QUICK if quick else (NUM_BACKENDS, CONCURRENCY, REQUESTS)
    backends, procs = start_backends(n_backends, 1 / chunk_rate if chunk_rate else 0.0, CHUNKS)
    gateway, route = start_route(backends)
    procs.append(route)
    passes: dict[str, list[tuple[list[float], float]]] = {"direct": [], "through gateway": []}
    health: list[float] = []
    try:
        for url in [*backends, gateway]:
            wait_healthy(url)
        asyncio.run(load(lambda i: gateway, concurrency, concurrency))  # warm-up, not measured
        for _ in range(rounds):
            direct = asyncio.run(load(lambda i: backends[i % n_backends], requests, concurrency))
            passes["direct"].append(direct)
            probe_process = subprocess.Popen(
                [sys.executable, "-c", f"from {__name__} import probe; probe({gateway!r})"],
                stdout=subprocess.PIPE,
                text=True,
            )
            passes["through gateway"].append(
                asyncio.run(load(lambda i: gateway, requests, concurrency))
            )
            probe_process.terminate()
            health += json.loads(probe_process.communicate()[0])["seconds"]
    finally:
        stop(procs)
    pace = f"{chunk_rate:g} chunks/s each" if chunk_rate else "chunks at once"
    print(
        f"{requests} streams of {CHUNKS} chunks ({pace}), {concurrency} at once, {n_backends} "
        f"backends, {rounds} rounds, direct and through the gateway in turn"
    )
    print(f"{'':>16} {'median ms':>10} {'p99 ms':>8} {'req/s':>7}")
    for name, runs in passes.items():
        latencies = [t for run, _ in runs for t in run]
        p99 = statistics.quantiles(latencies, n=100)[98]
        rate = statistics.median(r for _, r in runs)
        print(
            f"{name:>16} {1e3 * statistics.median(latencies):>10.1f} {1e3 * p99:>8.1f} {rate:>7.0f}"
        )
    pairs = list(zip(passes["direct"], passes["through gateway"], strict=True))
    added = [1e3 * (statistics.median(g) - statistics.median(d)) for (d, _), (g, _) in pairs]
    kept = [g / d for (_, d), (_, g) in pairs]
    ms = sorted(1e3 * t for t in health)
    print(
        f"the gateway added {statistics.median(added):.1f} ms at the median "
        f"[{min(added):.1f}, {max(added):.1f}] and kept {statistics.median(kept):.0%} "
        f"[{min(kept):.0%}, {max(kept):.0%}] of direct's requests/s; /health from its own "
        f"process while it served: median {statistics.median(ms):.0f} ms, worst {ms[-1]:.0f} ms "
        f"({len(ms)} probes)"
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


# --- each server its own process (`bench gateways` starts its gateways here too) -----------------


def start_route(
    backends: list[str], *options: str, env: dict[str, str] | None = None, stderr=None
) -> tuple[str, subprocess.Popen]:
    """`minivtc route` on a free port in front of `backends`, each given `BUDGET` tokens, with
    `options` besides: its URL and its process."""
    port = free_port()
    args = ["-m", "minivtc", "route", "--port", str(port), *options]
    args += [a for url in backends for a in ("--backend", f"{url}={BUDGET}")]
    return f"http://127.0.0.1:{port}", start(args, env, stderr)


def start(
    args: list[str], extra_env: dict[str, str] | None = None, stderr=None
) -> subprocess.Popen:
    """`python args` with one torch thread (each server is one process, as in production),
    its output discarded (`stderr`: where its errors go, else inherited)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(extra_env or {})}
    return subprocess.Popen(
        [sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=stderr
    )


def stop(procs: list[subprocess.Popen]) -> None:
    """Terminate each process still running, then wait for every one."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        proc.wait()
