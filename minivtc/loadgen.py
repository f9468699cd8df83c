"""The load generator: replay a trace against any OpenAI-compatible server, in real time.

Owns: `replay` (one streaming `/v1/completions` request per trace arrival, the client in the
`X-Client-Id` header, `max_tokens` = the trace's output length with EOS ignored) and the record
of what each client saw — time to first token and latency — as `metrics.Served` rows, the same
`requests.csv` the simulator writes, so `metrics.py` and `plots.py` measure a real run exactly
as they measure a simulated one. Does not own the server. Lesson 8 and `minivtc demo` use it.

The prompt is `input_tokens` token ids (a BOS of 1, then seeded ids in [100, 1000)), sent as a
list: any Llama-vocabulary server (minivtc, vLLM) takes it, and the length is exact, which text
could not promise across tokenizers. `ignore_eos` is vLLM's extension; `--no-ignore-eos` drops
it for servers that reject unknown fields.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from minivtc import metrics
from minivtc.metrics import Served
from minivtc.workloads import TraceRequest


@dataclass
class ReplayResult:
    served: list[Served]  # finished requests, in arrival order
    failed: Counter = field(default_factory=Counter)  # "HTTP 429: ..." -> count
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


def prompt_ids(n: int, rng: random.Random) -> list[int]:
    return [1] + [rng.randrange(100, 1000) for _ in range(n - 1)]


async def replay(
    url: str, trace: list[TraceRequest], speedup: float = 1.0, duration: float | None = None,
    drain_s: float | None = None, model: str | None = None, ignore_eos: bool = True,
    temperature: float = 0.0, seed: int = 0, progress: bool = True,
) -> ReplayResult:  # fmt: skip
    """Send each request at `arrival_s / speedup` seconds after the start (those arriving
    before `duration`, in trace time), then wait up to `drain_s` for the last to finish."""
    if speedup <= 0:
        raise ValueError(f"speedup must be > 0, got {speedup}")
    trace = [t for t in trace if duration is None or t.arrival_s < duration]
    if not trace:
        raise ValueError("the trace has no requests to send (check --duration)")
    rng = random.Random(seed)
    bodies = [body(t, prompt_ids(t.input_tokens, rng), model, ignore_eos, temperature)
              for t in trace]  # fmt: skip
    result = ReplayResult(served=[])
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as http:
        start = time.monotonic()
        tasks = [
            asyncio.create_task(one(http, t, b, start + t.arrival_s / speedup, start, result))
            for t, b in zip(trace, bodies, strict=True)
        ]
        reporter = asyncio.create_task(report(tasks, result, start)) if progress else None
        last = start + trace[-1].arrival_s / speedup
        timeout = None if drain_s is None else max(0.0, last - time.monotonic()) + drain_s
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:  # closing the stream makes the server abort the request
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        result.unfinished = len(pending)
        if reporter:
            reporter.cancel()
        result.wall_s = time.monotonic() - start
    result.served.sort(key=lambda r: r.arrival_s)
    if progress:
        print(f"  done: {summary_line(tasks, result, result.wall_s)}", file=sys.stderr)
    return result


def body(t: TraceRequest, ids: list[int], model: str | None, ignore_eos: bool, temperature: float
         ) -> dict:  # fmt: skip
    b = {
        "prompt": ids, "max_tokens": t.output_tokens, "temperature": temperature, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    if model:
        b["model"] = model
    if ignore_eos:
        b["ignore_eos"] = True
    return b


async def one(
    http: httpx.AsyncClient, t: TraceRequest, payload: dict, send_at: float, start: float,
    result: ReplayResult,
) -> None:  # fmt: skip
    await asyncio.sleep(max(0.0, send_at - time.monotonic()))
    sent = time.monotonic()
    first = None
    completion_tokens = 0
    try:
        headers = {"X-Client-Id": t.client}
        async with http.stream("POST", "/v1/completions", json=payload, headers=headers) as resp:
            if resp.status_code != 200:
                await resp.aread()
                result.failed[f"HTTP {resp.status_code}: {error_message(resp.text)}"] += 1
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                if chunk.get("choices") and first is None:
                    first = time.monotonic()
                if chunk.get("usage"):
                    completion_tokens = chunk["usage"]["completion_tokens"]
    except httpx.HTTPError as e:
        result.failed[f"{type(e).__name__}: {e}"] += 1
        return
    end = time.monotonic()
    if first is None:
        result.failed["stream ended without a token"] += 1
        return
    result.served.append(
        Served(
            t.client,
            sent - start,
            t.input_tokens,
            completion_tokens or t.output_tokens,
            first - sent,
            end - sent,
        )  # fmt: skip
    )


def error_message(text: str) -> str:
    try:
        return json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return text[:200]


async def report(tasks: list[asyncio.Task], result: ReplayResult, start: float) -> None:
    while True:
        await asyncio.sleep(5.0)
        print(f"  {summary_line(tasks, result, time.monotonic() - start)}", file=sys.stderr)


def summary_line(tasks: list[asyncio.Task], result: ReplayResult, elapsed: float) -> str:
    failed = sum(result.failed.values())
    rest = f"{result.unfinished} cancelled" if elapsed >= result.wall_s > 0 else (
        f"{sum(not t.done() for t in tasks)} in flight or not sent yet"
    )  # fmt: skip
    return (
        f"{elapsed:5.1f} s: {len(result.served)} finished, {failed} failed, {rest}, of {len(tasks)}"
    )


def write_run(result: ReplayResult, out: str | Path) -> dict:
    """requests.csv, metrics.json and the plots of a real run, as `minivtc simulate` writes."""
    from minivtc import plots

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    served = result.served
    metrics.write_requests(out / "requests.csv", served)
    summary: dict = {
        "served": len(served), "failed": sum(result.failed.values()),
        "unfinished": result.unfinished, "wall_s": round(result.wall_s, 1),
    }  # fmt: skip
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
