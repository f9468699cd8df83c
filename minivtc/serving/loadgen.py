"""The load generator: replay a trace against any OpenAI-compatible server, in real time.

Owns: `replay` (one streaming `/v1/completions` request per trace arrival, the client in the
`X-Client-Id` header, `max_tokens` = the trace's output length with EOS ignored) and the record
of what each client saw — time to first token and latency — as `metrics.Served` rows, the same
`requests.csv` the simulator writes, so `metrics.py` and `plots.py` measure a real run exactly
as they measure a simulated one. Does not own the server. Lesson 9 and `minivtc demo` use it.

The prompt is `input_tokens` token ids (a BOS of 1, then seeded ids in [100, 1000)), sent as a
list: any Llama-vocabulary server (minivtc, vLLM) takes it, and the length is exact, which text
could not promise across tokenizers. Requests with the same `prefix_id` share their first
`prefix_tokens` ids, as in the simulator, so a server's prefix cache can find them; the cached
prompt tokens it reports (`usage.prompt_tokens_details.cached_tokens`) are recorded.
`ignore_eos` is vLLM's extension; `--no-ignore-eos` drops it for servers that reject unknown
fields. Given several server roots, requests go to them round-robin in arrival order (the
field's baseline in front of replicas: `minivtc demo --replicas 2`, Lesson 14).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from minivtc.serving.connections import sse_lines
from minivtc.sim import metrics
from minivtc.sim.metrics import Served
from minivtc.sim.workloads import TraceRequest

__all__ = ["ReplayResult", "replay", "run_replay", "write_run"]


@dataclass
class ReplayResult:
    served: list[Served]  # finished requests, in arrival order
    failed: Counter = field(default_factory=Counter)  # "HTTP 429: ..." -> count
    failed_by_client: Counter = field(default_factory=Counter)  # client -> count
    unfinished: int = 0  # still running when the drain time ran out (cancelled)
    wall_s: float = 0.0


def run_replay(*args, **kwargs) -> ReplayResult:
    """`replay` from synchronous code — also inside Jupyter, whose event loop is already
    running (there `asyncio.run` would refuse), by running it on a fresh thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(replay(*args, **kwargs))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, replay(*args, **kwargs)).result()


def prompt_ids(t: TraceRequest, rng: random.Random, prefixes: dict[str, list[int]]) -> list[int]:
    """A BOS, then seeded ids; the first `prefix_tokens` are its `prefix_id`'s (the first request
    with that id chooses them, a later one with a longer prefix extends them)."""
    ids = [1] + [rng.randrange(100, 1000) for _ in range(t.input_tokens - 1)]
    if t.prefix_id is None:
        return ids
    shared = prefixes.setdefault(t.prefix_id, [])
    shared += ids[len(shared) : t.prefix_tokens]
    return shared[: t.prefix_tokens] + ids[t.prefix_tokens :]


@dataclass(frozen=True)
class Bodies:
    """What each replayed request's body asks for besides its lengths: the model's name (None:
    the server's), EOS ignored (so every request generates its trace's output length), the
    temperature, and the seed of the prompts' token ids."""

    model: str | None = None
    ignore_eos: bool = True
    temperature: float = 0.0
    seed: int = 0


async def replay(
    url: str | Sequence[str],
    trace: list[TraceRequest],
    speedup: float = 1.0,
    duration: float | None = None,
    drain_s: float | None = None,
    progress: bool = True,
    **bodies: Any,
) -> ReplayResult:
    """Send each request at `arrival_s / speedup` seconds after the start (those arriving
    before `duration`, in trace time), then wait up to `drain_s` for the last to finish.
    `url`: a server root, or several: the k-th request in arrival order goes to the k mod n-th.
    `bodies`: `Bodies`' fields (model, ignore_eos, temperature, seed)."""
    shape = Bodies(**bodies)
    if speedup <= 0:
        raise ValueError(f"speedup must be > 0, got {speedup}")
    urls = [url] if isinstance(url, str) else list(url)
    if not urls:
        raise ValueError("no server to send to: give at least one URL")
    trace = [t for t in trace if duration is None or t.arrival_s < duration]
    if not trace:
        raise ValueError("the trace has no requests to send (check --duration)")
    rng, prefixes = random.Random(shape.seed), dict[str, list[int]]()
    requests = [body(t, prompt_ids(t, rng, prefixes), shape) for t in trace]
    result = ReplayResult(served=[])
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    with trace_bar(math.ceil(trace[-1].arrival_s), progress) as bar:
        async with contextlib.AsyncExitStack() as stack:
            servers = [
                await stack.enter_async_context(
                    httpx.AsyncClient(base_url=u, timeout=None, limits=limits)
                )
                for u in urls
            ]
            start = time.monotonic()
            tasks = []
            for k, (t, b) in enumerate(zip(trace, requests, strict=True)):
                http = servers[k % len(servers)]  # round-robin, in arrival order
                send_at = start + t.arrival_s / speedup
                tasks.append(asyncio.create_task(one(http, t, b, send_at, start, result)))
            reporter = asyncio.create_task(report(tasks, result, start, speedup, bar))
            last = start + trace[-1].arrival_s / speedup
            timeout = None if drain_s is None else max(0.0, last - time.monotonic()) + drain_s
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:  # closing the stream makes the server abort the request
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            result.unfinished = len(pending)
            reporter.cancel()
            result.wall_s = time.monotonic() - start
        bar.set_postfix_str(counts(tasks, result, done=True), refresh=False)
        bar.update(bar.total - bar.n)
    result.served.sort(key=lambda r: r.arrival_s)
    return result


def trace_bar(trace_s: int, enabled: bool) -> tqdm:
    """A bar of the trace's seconds sent so far, on stderr (silent if not `enabled`). On a
    terminal it redraws in place; in a log or CI, where every redraw lengthens one line, every
    30 s. miniters=0: a redraw may show new counts while the trace time stands still (drain)."""
    interval = 0.1 if sys.stderr.isatty() else 30.0
    look = "{desc}: {percentage:3.0f}%|{bar}| {n}/{total} s of the trace [{elapsed}{postfix}]"
    return tqdm(
        total=max(trace_s, 1),
        desc="replaying",
        bar_format=look,
        file=sys.stderr,
        disable=not enabled,
        mininterval=interval,
        miniters=0,
        dynamic_ncols=True,
    )


def body(t: TraceRequest, ids: list[int], b: Bodies) -> dict:
    request = {
        "prompt": ids,
        "max_tokens": t.output_tokens,
        "temperature": b.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if b.model:
        request["model"] = b.model
    if b.ignore_eos:
        request["ignore_eos"] = True
    return request


async def one(
    http: httpx.AsyncClient,
    t: TraceRequest,
    payload: dict,
    send_at: float,
    start: float,
    result: ReplayResult,
) -> None:
    await asyncio.sleep(max(0.0, send_at - time.monotonic()))
    sent = time.monotonic()
    first = None
    completion_tokens = cached_tokens = 0
    try:
        headers = {"X-Client-Id": t.client}
        async with http.stream("POST", "/v1/completions", json=payload, headers=headers) as resp:
            if resp.status_code != 200:
                await resp.aread()
                why = f"HTTP {resp.status_code}: {error_message(resp.text)}"
                return failed(result, t, why)
            async for line in sse_lines(resp.aiter_bytes()):
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[len(b"data: ") :])
                if chunk.get("choices") and first is None:
                    first = time.monotonic()
                if usage := chunk.get("usage"):
                    completion_tokens = usage["completion_tokens"]
                    cached_tokens = (usage.get("prompt_tokens_details") or {}).get(
                        "cached_tokens", 0
                    )
    except httpx.HTTPError as e:
        return failed(result, t, f"{type(e).__name__}: {e}")
    end = time.monotonic()
    if first is None:
        return failed(result, t, "stream ended without a token")
    result.served.append(
        Served(
            t.client,
            sent - start,
            t.input_tokens,
            completion_tokens or t.output_tokens,
            first - sent,
            end - sent,
            cached_tokens,  # what the server's prefix cache held (0 without one)
        )
    )


def failed(result: ReplayResult, t: TraceRequest, why: str) -> None:
    result.failed[why] += 1
    result.failed_by_client[t.client] += 1


def error_message(text: str) -> str:
    try:
        return json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return text[:200]


async def report(
    tasks: list[asyncio.Task], result: ReplayResult, start: float, speedup: float, bar: tqdm
) -> None:
    """Once a second: the trace time reached (the bar), and what became of the requests."""
    if bar.disable:
        return
    while True:
        await asyncio.sleep(1.0)
        sent_s = min(int((time.monotonic() - start) * speedup), bar.total)
        bar.set_postfix_str(counts(tasks, result), refresh=False)
        bar.update(sent_s - bar.n)


def counts(tasks: list[asyncio.Task], result: ReplayResult, done: bool = False) -> str:
    failed = sum(result.failed.values())
    rest = (
        f"{result.unfinished} cancelled"
        if done
        else (f"{sum(not t.done() for t in tasks)} in flight or not sent yet")
    )
    return f"{len(result.served)} finished, {failed} failed, {rest}, of {len(tasks)}"


def write_run(result: ReplayResult, out: str | Path) -> dict:
    """requests.csv, metrics.json and the plots of a real run, as `minivtc simulate` writes."""
    from minivtc.experiments import plots

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    served = result.served
    metrics.write_requests(out / "requests.csv", served)
    summary: dict = {
        "served": len(served),
        "failed": sum(result.failed.values()),
        "unfinished": result.unfinished,
        "wall_s": round(result.wall_s, 1),
    }
    if served:
        horizon = max(r.end_s for r in served)  # the whole run, to the last token
        _, gaps = metrics.accumulated_service_diff(served, horizon, skip_before=0.0)
        tokens = sum(r.input_tokens + r.output_tokens for r in served)
        summary.update(
            throughput_tok_s=round(tokens / result.wall_s, 1),
            max_accumulated_gap=round(max(gaps), 1),
            service_per_client={
                c: round(v, 1) for c, v in metrics.service(served, 0, float("inf")).items()
            },
            mean_ttft_per_client={c: round(v, 3) for c, v in metrics.mean_ttft(served).items()},
            failures=dict(result.failed),
        )
        window = 60.0 if horizon >= 300 else max(5.0, horizon / 6)  # short runs: short windows
        plots.service_plot(served, horizon, out / "service.png", window=window)
        plots.response_plot(served, horizon, out / "response.png")
    (out / "metrics.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
