"""`minivtc demo`: what VTC fixes, on real tokens, in about three minutes on a laptop CPU.

Owns the demo's recipe: measure what this machine's engine can serve, build a workload that
overloads it — a heavy client sending 3x the light client's rate — and replay it over HTTP
against the real server on the bundled model, first under FCFS, then under VTC. It prints a
side-by-side table and writes `demo.png` (service rate and time to first token over time).
Everything it runs is the package's own code: `server.py`, `loadgen.py`, `metrics.py`. Lesson 0.
With `--dashboard`, both runs serve at one address, where `/dashboard` draws them live.

What to expect: under FCFS both clients queue behind the heavy client's backlog, so the light
client's time to first token grows for as long as the overload lasts; under VTC the light
client, asking for less than half of the server, gets all it asks for at once and the heavy
client absorbs the whole overload (Theorem 4.4's isolation).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from minivtc.core.weights import load_model
from minivtc.harness import metrics
from minivtc.harness.workloads import TraceRequest
from minivtc.llm import build_engine
from minivtc.serving.dashboard import announce, dashboard_url
from minivtc.serving.loadgen import ReplayResult, run_replay
from minivtc.serving.server import BackgroundServer, make_app

INPUT_TOKENS, OUTPUT_TOKENS = 32, 96  # per request: the demo's cost is 32 + 2 * 96 = 224
BATCH = 16  # the KV pool holds this many requests: the server's capacity is small and clear
OVERLOAD = 1.4  # offered load / what the server served in calibration
HEAVY_SHARE = 0.75  # the heavy client sends 3x the light one's rate


@dataclass
class Plan:
    capacity_req_s: float  # measured on this machine, over HTTP
    heavy_rate: float
    light_rate: float
    duration: float
    trace: list[TraceRequest]


def main(
    out: str | Path, duration: float = 60.0, drain: float = 10.0, dashboard: int | None = None
) -> dict:
    """`dashboard`: a port, where each run's server answers (`/dashboard`, `dashboard.py`)."""
    url = dashboard_url(dashboard) if dashboard is not None else None  # (refused now if taken)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    say("loading the bundled model ...")
    model, tokenizer = load_model()
    plan = make_plan(model, tokenizer, duration)
    say(
        f"this machine serves ~{plan.capacity_req_s:.1f} requests/s of {INPUT_TOKENS} + "
        f"{OUTPUT_TOKENS} tokens; offering {plan.heavy_rate + plan.light_rate:.1f}/s: "
        f"heavy {plan.heavy_rate:.1f}/s, light {plan.light_rate:.1f}/s, for {duration:.0f} s"
    )
    if url is not None:
        say(announce(url))
    runs: dict[str, ReplayResult] = {}
    for scheduler in ("fcfs", "vtc"):
        say(f"\n[{scheduler}] serving the workload over HTTP ...")
        runs[scheduler] = serve_once(model, tokenizer, scheduler, plan.trace, drain, port=dashboard)
        metrics.write_requests(out / f"requests_{scheduler}.csv", runs[scheduler].served)
    rows = table(runs, plan)
    text = format_table(rows)
    print("\n" + text)
    (out / "demo.md").write_text(text + "\n")
    plot(runs, plan, out / "demo.png")
    say(f"\nwrote {out}/demo.png, demo.md, requests_fcfs.csv, requests_vtc.csv")
    return rows


def make_plan(model, tokenizer, duration: float) -> Plan:
    capacity = calibrate(model, tokenizer)
    offered = OVERLOAD * capacity
    heavy, light = HEAVY_SHARE * offered, (1 - HEAVY_SHARE) * offered
    trace = evenly("heavy", heavy, duration) + evenly("light", light, duration, offset=0.5)
    trace.sort(key=lambda t: t.arrival_s)
    return Plan(capacity, heavy, light, duration, trace)


def evenly(client: str, rate: float, duration: float, offset: float = 0.0) -> list[TraceRequest]:
    gap = 1 / rate
    n = int(duration * rate)
    return [TraceRequest(client, (k + offset) * gap, INPUT_TOKENS, OUTPUT_TOKENS) for k in range(n)]


def calibrate(model, tokenizer) -> float:
    """Requests per second the server finishes over HTTP with a full batch (about 6 s).

    Measured through the server, not the engine alone: on a 2-core laptop the HTTP streams
    (server and load generator share the CPU with the model) cost about half the throughput."""
    burst = [TraceRequest("calibration", 0.0, INPUT_TOKENS, OUTPUT_TOKENS)] * (2 * BATCH)
    result = serve_once(model, tokenizer, "fcfs", burst, drain=None, progress=False)
    return len(result.served) / result.wall_s


def serve_once(
    model,
    tokenizer,
    scheduler: str,
    trace: list[TraceRequest],
    drain: float | None,
    progress: bool = True,
    port: int | None = None,
) -> ReplayResult:
    """A fresh engine and server under `scheduler` (on `port`, else a free one), the trace
    replayed against it."""
    engine = build_engine(
        model, tokenizer, scheduler, kv_tokens=BATCH * (INPUT_TOKENS + OUTPUT_TOKENS)
    )
    with BackgroundServer(make_app(engine, tokenizer), port=port or 0) as url:
        result = run_replay(url, trace, drain_s=drain, progress=progress)
    if result.failed:
        say(f"  failed requests: {dict(result.failed)}")
    return result


# --- the report --------------------------------------------------------------------------------


def table(runs: dict[str, ReplayResult], plan: Plan) -> dict:
    rows: dict[str, dict[str, str]] = {}
    for name, run in runs.items():
        served = run.served
        service = metrics.service(served, 0.0, float("inf"))
        col: dict[str, str] = {}
        for client in ("heavy", "light"):
            mine = [r for r in served if r.client == client]
            sent = sum(t.client == client for t in plan.trace)
            ttft = [r.first_token_latency_s for r in mine]
            col[f"{client}: finished / sent"] = f"{len(mine)} / {sent}"
            col[f"{client}: service (tokens)"] = f"{service.get(client, 0.0):,.0f}"
            col[f"{client}: mean TTFT (s)"] = f"{statistics.fmean(ttft):.2f}" if ttft else "-"
            col[f"{client}: max TTFT (s)"] = f"{max(ttft):.2f}" if ttft else "-"
        _, gaps = metrics.accumulated_service_diff(served, plan.duration)
        col["max service difference (tokens)"] = f"{max(gaps, default=0.0):,.0f}"  # (none served)
        tokens = sum(r.input_tokens + r.output_tokens for r in served)
        col["throughput (tokens/s)"] = f"{tokens / run.wall_s:,.0f}"
        col["cancelled at the end"] = str(run.unfinished)
        for key, value in col.items():
            rows.setdefault(key, {})[name.upper()] = value
    return rows


def format_table(rows: dict[str, dict[str, str]]) -> str:
    names = list(next(iter(rows.values())))
    width = max(len(k) for k in rows)
    lines = [f"| {'':<{width}} | " + " | ".join(f"{n:>10}" for n in names) + " |"]
    lines.append(f"| {'-' * width} | " + " | ".join("-" * 10 for _ in names) + " |")
    for key, cols in rows.items():
        lines.append(f"| {key:<{width}} | " + " | ".join(f"{cols[n]:>10}" for n in names) + " |")
    return "\n".join(lines)


def plot(runs: dict[str, ReplayResult], plan: Plan, path: Path) -> Path:
    """Top: service rate per client (10 s windows), offered rate dotted. Bottom: each request's
    time to first token at its arrival time."""
    from minivtc.harness.plots import plt, save

    fig, axes = plt.subplots(2, len(runs), figsize=(11, 6.5), sharex=True, sharey="row")
    offered = {"heavy": plan.heavy_rate, "light": plan.light_rate}
    cost = INPUT_TOKENS + 2 * OUTPUT_TOKENS
    for col, (name, run) in enumerate(runs.items()):
        top, bottom = axes[0][col], axes[1][col]
        ticks, rates = metrics.service_rates(run.served, plan.duration, num_x=24, window=10.0)
        for i, client in enumerate(("heavy", "light")):
            top.plot(ticks, rates.get(client, [0.0] * len(ticks)), f"C{i}", label=client)
            top.axhline(offered[client] * cost, color=f"C{i}", linestyle=":", alpha=0.7)
            mine = [r for r in run.served if r.client == client]
            bottom.plot(
                [r.arrival_s for r in mine],
                [r.first_token_latency_s for r in mine],
                f"C{i}.",
                markersize=3,
                label=client,
            )
        top.set(
            title=f"{name.upper()}: service rate (dotted: what was asked)",
            ylabel="tokens/s (input + 2 x output)",
        )
        bottom.set(
            title=f"{name.upper()}: time to first token",
            xlabel="arrival time (s)",
            ylabel="seconds",
        )
        top.legend(fontsize=8)
        bottom.legend(fontsize=8)
    return save(fig, path)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
