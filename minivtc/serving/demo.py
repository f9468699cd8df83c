"""`minivtc demo`: what VTC fixes, on real tokens, in about three minutes on a laptop CPU.

Owns the demo's recipe: measure what this machine's engine can serve, build a workload that
overloads it — a heavy client sending 3x the light client's rate — and replay it over HTTP
against the real server on the bundled model, first under FCFS, then under VTC. It prints a
side-by-side table, each client's offered load against what it received and the run's verdict
in one line, and writes `demo.png` (service rate and time to first token over time).
Everything it runs is the package's own code: `server.py`, `loadgen.py`, `metrics.py`. Lesson 0.
With `--dashboard`, both runs serve at one address, where `/dashboard` draws them live.

What to expect: under FCFS both clients queue behind the heavy client's backlog, so the light
client waits for as long as that backlog takes to serve; under VTC the light client, asking
for less than half of the server, gets all it asks for at once and the heavy client absorbs
the whole overload (Theorem 4.4's isolation).

Every part of the workload is measured in units of this machine's capacity C (requests/s,
measured over HTTP first), so the demo shows the same thing on any machine: the clients offer
1.4 C for `duration` seconds, so the backlog grows by 0.4 C requests a second, about 24 s of
the server's work by the end of a minute. A faster machine builds a backlog of as many seconds
but of more requests, each an open stream, so the server's limits scale with C too: each
client may hold `BACKLOG_MARGIN` times the whole run's backlog in flight (the server's
`--max-client-requests`, beyond which a client's new requests get 429), and the connection cap
is four clients' worth. The demo's two clients never meet either limit (`tests/test_demo.py`),
and the server's own log goes to a file (`server.log`), not the terminal.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from minivtc.engine.factory import build_engine
from minivtc.model.weights import load_model
from minivtc.serving.allocator import name_of
from minivtc.serving.connections import Limits
from minivtc.serving.dashboard import announce, dashboard_url
from minivtc.serving.hosting import BackgroundServer
from minivtc.serving.loadgen import ReplayResult, run_replay
from minivtc.serving.server import make_app
from minivtc.sim import metrics
from minivtc.sim.workloads import TraceRequest

__all__ = ["BATCH", "INPUT_TOKENS", "OUTPUT_TOKENS", "ServerSetup", "WARM_UP_S", "format_table"]
__all__ += ["main", "make_plan", "plan_for", "plot", "say", "serve_once", "table", "throughput"]
__all__ += ["verdicts"]

INPUT_TOKENS, OUTPUT_TOKENS = 32, 96  # per request: the demo's cost is 32 + 2 * 96 = 224
BATCH = 16  # the KV pool holds this many requests: the server's capacity is small and clear
OVERLOAD = 1.4  # offered load / what the server served in calibration
HEAVY_SHARE = 0.75  # the heavy client sends 3x the light one's rate
# A client may hold this times the backlog a whole run builds (0.4 C per second): room for a
# machine slower during the runs than when the demo measured it
BACKLOG_MARGIN = 1.5
CLIENTS = ("heavy", "light")
WARM_UP_S = 5.0  # the throughput row counts from here: by then the server is full


@dataclass(frozen=True)
class ServerSetup:
    """How each run's server is set up: its limits, its port (0: a free one), its log file
    (None: the terminal)."""

    limits: Limits = Limits()
    port: int = 0
    log_path: str | None = None


@dataclass
class Plan:
    capacity_req_s: float  # measured on this machine, over HTTP
    heavy_rate: float
    light_rate: float
    duration: float
    trace: list[TraceRequest]
    server: ServerSetup  # each client's share of requests in flight, scaled to the capacity

    def offered(self, client: str) -> float:
        """What `client` asks for, in tokens/s (input + output)."""
        rate = self.heavy_rate if client == "heavy" else self.light_rate
        return rate * (INPUT_TOKENS + OUTPUT_TOKENS)


def main(
    out: str | Path, duration: float = 60.0, drain: float = 10.0, dashboard: int | None = None
) -> dict:
    """`dashboard`: a port, where each run's server answers (`/dashboard`, `dashboard.py`)."""
    url = dashboard_url(dashboard) if dashboard is not None else None  # (refused now if taken)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "server.log"
    log.write_text("")
    say(f"loading the bundled model ... (allocator: {name_of(os.environ.get('LD_PRELOAD'))})")
    model, tokenizer = load_model()
    plan = make_plan(model, tokenizer, duration)
    setup = replace(plan.server, port=dashboard or 0, log_path=str(log))
    say(
        f"this machine serves ~{plan.capacity_req_s:.1f} requests/s of {INPUT_TOKENS} + "
        f"{OUTPUT_TOKENS} tokens; offering {plan.heavy_rate + plan.light_rate:.1f}/s: "
        f"heavy {plan.heavy_rate:.1f}/s, light {plan.light_rate:.1f}/s, for {duration:.0f} s; "
        f"the server's log: {log}"
    )
    if url is not None:
        say(announce(url))
    runs: dict[str, ReplayResult] = {}
    for scheduler in ("fcfs", "vtc"):
        say(f"\n[{scheduler}] serving the workload over HTTP ...")
        runs[scheduler] = serve_once(model, tokenizer, scheduler, plan.trace, drain, setup=setup)
        metrics.write_requests(out / f"requests_{scheduler}.csv", runs[scheduler].served)
    rows = table(runs, plan)
    text = format_table(rows) + "\n\n" + "\n".join(verdicts(runs, plan))
    text += f"\n\n(the server's log: {log})"
    print("\n" + text)
    (out / "demo.md").write_text(text + "\n")
    plot(runs, plan, out / "demo.png")
    say(f"\nwrote {out}/demo.png, demo.md, requests_fcfs.csv, requests_vtc.csv, server.log")
    return rows


def make_plan(model, tokenizer, duration: float) -> Plan:
    return plan_for(calibrate(model, tokenizer), duration)


def plan_for(capacity: float, duration: float) -> Plan:
    """The workload and limits for a server (or fleet) that serves `capacity` requests/s."""
    offered = OVERLOAD * capacity
    heavy, light = HEAVY_SHARE * offered, (1 - HEAVY_SHARE) * offered
    trace = evenly("heavy", heavy, duration) + evenly("light", light, duration, offset=0.5)
    trace.sort(key=lambda t: t.arrival_s)
    return Plan(
        capacity, heavy, light, duration, trace, ServerSetup(limits_for(capacity, duration))
    )


def limits_for(capacity_req_s: float, duration: float) -> Limits:
    """Each client may hold `BACKLOG_MARGIN` times the backlog a run builds on this machine
    (and at least two full batches); the connection cap is four clients' worth. So neither
    limit is met by the demo's load, whatever the machine's speed."""
    backlog = (OVERLOAD - 1) * capacity_req_s * duration
    share = max(2 * BATCH, math.ceil(BACKLOG_MARGIN * backlog) + BATCH)
    return Limits(max_connections=4 * share, max_client_requests=share)


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
    setup: ServerSetup = ServerSetup(),
) -> ReplayResult:
    """A fresh engine and server under `scheduler`, set up as `setup` says (`Plan.server`: the
    limits scaled to this machine), the trace replayed against it."""
    engine = build_engine(
        model, tokenizer, scheduler, kv_tokens=BATCH * (INPUT_TOKENS + OUTPUT_TOKENS)
    )
    app = make_app(engine, tokenizer, limits=setup.limits)
    with BackgroundServer(app, port=setup.port, log_path=setup.log_path) as url:
        result = run_replay(url, trace, drain_s=drain, progress=progress)
    if result.failed:
        say(f"  refused or failed: {dict(result.failed)}")
    return result


# --- the report --------------------------------------------------------------------------------


def table(runs: dict[str, ReplayResult], plan: Plan) -> dict:
    rows: dict[str, dict[str, str]] = {}
    for name, run in runs.items():
        col: dict[str, str] = {}
        for client in CLIENTS:
            col.update(client_rows(client, run, plan))
        _, gaps = metrics.accumulated_service_diff(run.served, plan.duration)
        col["max service difference (tokens)"] = f"{max(gaps, default=0.0):,.0f}"  # (none served)
        col["throughput while overloaded (tokens/s)"] = f"{throughput(run, plan):,.0f}"
        col["cancelled at the end"] = str(run.unfinished)
        for key, value in col.items():
            rows.setdefault(key, {})[name.upper()] = value
    return rows


def client_rows(client: str, run: ReplayResult, plan: Plan) -> dict[str, str]:
    mine = [r for r in run.served if r.client == client]
    sent = sum(t.client == client for t in plan.trace)
    ttft = [r.first_token_latency_s for r in mine]
    service = metrics.service(run.served, 0.0, float("inf"))
    return {
        f"{client}: offered / received (tokens/s)": (
            f"{plan.offered(client):,.0f} / {received(client, run, plan):,.0f}"
        ),
        f"{client}: finished / sent": f"{len(mine)} / {sent}",
        f"{client}: refused (429) or failed": str(run.failed_by_client[client]),
        f"{client}: service (tokens)": f"{service.get(client, 0.0):,.0f}",
        f"{client}: mean TTFT (s)": f"{statistics.fmean(ttft):.2f}" if ttft else "-",
        f"{client}: max TTFT (s)": f"{max(ttft):.2f}" if ttft else "-",
    }


def tokens(r: metrics.Served) -> float:
    return r.input_tokens + r.output_tokens


def received(client: str, run: ReplayResult, plan: Plan) -> float:
    """Tokens/s (input + output) that `client` received over the run's arrivals."""
    mine = [r for r in run.served if r.client == client]
    return metrics.service(mine, 0.0, plan.duration, cost=tokens).get(client, 0.0) / plan.duration


def throughput(run: ReplayResult, plan: Plan) -> float:
    """Tokens/s (input + output) the server delivered to both clients while it was overloaded:
    from `WARM_UP_S` (its pool full by then) to the end of the arrivals, each request's
    tokens spread over its decode span. Unlike finished tokens over the run's wall time, this
    does not depend on how much of the backlog the drain lets finish."""
    window = metrics.service(run.served, WARM_UP_S, plan.duration, cost=tokens)
    return sum(window.values()) / (plan.duration - WARM_UP_S)


def verdicts(runs: dict[str, ReplayResult], plan: Plan) -> list[str]:
    """One line per run, computed from it: did the light client get all it asked for, at once,
    and who absorbed the overload."""
    lines = []
    for name, run in runs.items():
        light = [r for r in run.served if r.client == "light"]
        sent = sum(t.client == "light" for t in plan.trace)
        wait = statistics.fmean(r.first_token_latency_s for r in light) if light else math.inf
        share = received("heavy", run, plan) / plan.offered("heavy")
        heavy = f"heavy received {share:.0%} of what it offered"
        if run.failed_by_client["heavy"]:
            heavy += f" ({run.failed_by_client['heavy']} of its requests refused)"
        if len(light) == sent and wait < 1.0:
            says = f"light received all it asked for (mean TTFT {wait:.2f} s); {heavy}"
            says += ": heavy absorbed the overload"
        elif len(light) == sent:
            says = f"light's {sent} requests all finished, but it waited {wait:.2f} s on average"
            says += f" behind the backlog; {heavy}"
        else:
            says = f"light lost {sent - len(light)} of its {sent} requests; {heavy}"
        lines.append(f"{name.upper()}: {says}.")
    return lines


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
    from minivtc.experiments.plots import plt, save

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
