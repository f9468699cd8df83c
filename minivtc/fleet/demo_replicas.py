"""`minivtc demo --replicas N`: N backends behind the fair gateway against round-robin, on real
tokens over HTTP.

Owns the fleet demo's recipe. N `minivtc serve` backends run in this process on the bundled
model, each with VTC and a KV pool of `demo.BATCH` requests. The demo measures what the N of
them serve together, builds `minivtc demo`'s workload at that scale (a heavy client sending 3x
the light client's rate, 1.4x what the fleet serves) and replays it twice, on fresh backends
each time: through the gateway (`minivtc route`'s app: one dispatcher, one VTC for every
backend, a request bound only where it fits), and round-robin straight to the backends, each
queueing behind its own VTC (the field's practice). It prints `minivtc demo`'s table, one column
per run, and writes demo.png, demo.md and each run's requests.csv. Lesson 11.

What to expect with N = 2 (any even N): the light client asks for about a third of the fleet,
less than its fair half, so the gateway serves it at once and the heavy client absorbs the
overload. Round-robin sends requests in arrival order, and the workload's arrivals repeat
heavy, heavy, light, heavy: every light request lands on the same replica, whose VTC gives it
half of that one replica, less than it asks, so its time to first token grows while the
overload lasts (an aliasing of arrivals with replicas that per-replica counters cannot see).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from minivtc.core.tokenizer import Tokenizer
from minivtc.core.vtc import VTC
from minivtc.core.weights import load_model
from minivtc.fleet.gateway import Gateway
from minivtc.fleet.gateway_app import make_gateway
from minivtc.fleet.gateway_cli import backends_of
from minivtc.harness import metrics
from minivtc.harness.workloads import TraceRequest
from minivtc.llm import build_engine
from minivtc.serving import demo
from minivtc.serving.api_keys import Gate
from minivtc.serving.loadgen import ReplayResult, run_replay
from minivtc.serving.server import BackgroundServer, make_app

RUNS = ("gateway", "round-robin")


def main(out: str | Path, duration: float = 60.0, drain: float = 10.0, replicas: int = 2) -> dict:
    if replicas < 2:
        raise ValueError(f"--replicas must be >= 2 for the fleet demo, got {replicas}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    demo.say("loading the bundled model ...")
    model, tokenizer = load_model()
    capacity = calibrate(model, tokenizer, replicas)
    plan = make_plan(capacity, duration)
    demo.say(
        f"{replicas} backends serve ~{capacity:.1f} requests/s of {demo.INPUT_TOKENS} + "
        f"{demo.OUTPUT_TOKENS} tokens together; offering {plan.heavy_rate + plan.light_rate:.1f}"
        f"/s: heavy {plan.heavy_rate:.1f}/s, light {plan.light_rate:.1f}/s, for {duration:.0f} s"
    )
    runs: dict[str, ReplayResult] = {}
    for how in RUNS:
        demo.say(f"\n[{how}] {replicas} backends, serving the workload over HTTP ...")
        runs[how] = serve_fleet(model, tokenizer, replicas, how, plan.trace, drain)
        metrics.write_requests(out / f"requests_{how}.csv", runs[how].served)
    rows = demo.table(runs, plan)
    text = demo.format_table(rows)
    print("\n" + text)
    (out / "demo.md").write_text(text + "\n")
    demo.plot(runs, plan, out / "demo.png")
    names = ", ".join(f"requests_{how}.csv" for how in RUNS)
    demo.say(f"\nwrote {out}/demo.png, demo.md, {names}")
    return rows


def make_plan(capacity: float, duration: float) -> demo.Plan:
    """`demo.make_plan`'s workload for a fleet that serves `capacity` requests/s."""
    offered = demo.OVERLOAD * capacity
    heavy, light = demo.HEAVY_SHARE * offered, (1 - demo.HEAVY_SHARE) * offered
    trace = demo.evenly("heavy", heavy, duration) + demo.evenly(
        "light", light, duration, offset=0.5
    )
    trace.sort(key=lambda t: t.arrival_s)
    return demo.Plan(capacity, heavy, light, duration, trace)


def calibrate(model, tokenizer, replicas: int) -> float:
    """Requests per second the backends finish together, round-robin, full batches."""
    burst = [TraceRequest("calibration", 0.0, demo.INPUT_TOKENS, demo.OUTPUT_TOKENS)]
    burst *= 2 * demo.BATCH * replicas
    result = serve_fleet(model, tokenizer, replicas, "round-robin", burst, None, progress=False)
    return len(result.served) / result.wall_s


def serve_fleet(
    model,
    tokenizer: Tokenizer,
    replicas: int,
    how: str,
    trace: list[TraceRequest],
    drain: float | None,
    progress: bool = True,
) -> ReplayResult:
    """Fresh backends (VTC each); the trace replayed through the gateway or round-robin."""
    kv_tokens = demo.BATCH * (demo.INPUT_TOKENS + demo.OUTPUT_TOKENS)
    with contextlib.ExitStack() as stack:
        urls = []
        for _ in range(replicas):
            engine = build_engine(model, tokenizer, "vtc", kv_tokens=kv_tokens)
            urls.append(stack.enter_context(BackgroundServer(make_app(engine, tokenizer))))
        if how == "round-robin":
            result = run_replay(urls, trace, drain_s=drain, progress=progress)
        else:  # one VTC for the fleet, each backend's budget read from its /fairness
            gateway = Gateway(VTC(), backends_of(urls), tokenizer, "minivtc-tiny", Gate(None))
            with BackgroundServer(make_gateway(gateway)) as url:
                result = run_replay(url, trace, drain_s=drain, progress=progress)
    if result.failed:
        demo.say(f"  failed requests: {dict(result.failed)}")
    return result
