"""`minivtc demo --replicas N`: N backends behind the fair gateway against a round-robin router,
on real tokens over HTTP.

Owns the fleet demo's recipe. N `minivtc serve` processes on the bundled model (VTC each, a KV
pool of `demo.BATCH` requests each) stand behind a gateway in this process. The demo measures
what the gateway gets out of them with full batches, builds `minivtc demo`'s workload at that
scale (a heavy client sending 3x the light client's rate, 1.4x what was measured) and replays it
twice, on fresh backends each time:

- *gateway*: `minivtc route`'s app, one dispatcher holding one VTC for the whole fleet, a
  request bound to a backend only when it has room there;
- *round-robin*: the same app as the field's routers use it: every request sent at once, in
  arrival order, to the next backend in turn (FCFS, budgets without limit), each backend
  queueing behind its own VTC. Both runs pay for the same extra HTTP hop, so the table compares
  the policies, not the hop.

It prints `minivtc demo`'s table, one column per run, and writes demo.png, demo.md and each
run's requests.csv. Lesson 14.

What to expect with N = 2 (any even N): the light client asks for about a third of the fleet,
less than its fair half, so the gateway serves it at once and the heavy client absorbs the
overload. The workload's arrivals repeat heavy, heavy, light, heavy, so round-robin puts every
light request on the same replica, whose VTC gives it half of that one replica, less than it
asks: its time to first token grows while the overload lasts (an aliasing of arrivals with
replicas that per-replica counters cannot see). On a 2-core laptop the backends, the gateway
and the load generator share the CPU, so the numbers move with what else runs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from minivtc.fairness.scheduler import FCFS
from minivtc.fairness.vtc import VTC
from minivtc.fleet.backend import Backend, RoundRobin
from minivtc.gateway.app import make_gateway
from minivtc.gateway.gateway import Gateway
from minivtc.gateway.proxy import backends_of, free_port, wait_healthy
from minivtc.model.tokenizer import Tokenizer
from minivtc.model.weights import bundled_weights_dir
from minivtc.serving import demo
from minivtc.serving.api_keys import Auth
from minivtc.serving.hosting import BackgroundServer
from minivtc.serving.loadgen import ReplayResult, run_replay
from minivtc.sim import metrics
from minivtc.sim.workloads import TraceRequest

__all__ = ["main"]

RUNS = ("gateway", "round-robin")
UNLIMITED = 1 << 40  # the round-robin router's budgets: it never holds a request back
START_S = 120  # a backend that is not healthy by then did not start


def main(out: str | Path, duration: float = 60.0, drain: float = 10.0, replicas: int = 2) -> dict:
    if replicas < 2:
        raise ValueError(f"--replicas must be >= 2 for the fleet demo, got {replicas}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(bundled_weights_dir() / "tokenizer.model")
    demo.say(f"starting {replicas} backends on the bundled model and measuring them ...")
    capacity = calibrate(tokenizer, replicas)
    plan = demo.plan_for(capacity, duration)
    demo.say(
        f"{replicas} backends serve ~{capacity:.1f} requests/s of {demo.INPUT_TOKENS} + "
        f"{demo.OUTPUT_TOKENS} tokens through the gateway; offering "
        f"{plan.heavy_rate + plan.light_rate:.1f}/s: heavy {plan.heavy_rate:.1f}/s, light "
        f"{plan.light_rate:.1f}/s, for {duration:.0f} s"
    )
    runs: dict[str, ReplayResult] = {}
    for how in RUNS:
        demo.say(f"\n[{how}] {replicas} fresh backends, serving the workload over HTTP ...")
        runs[how] = serve_fleet(tokenizer, replicas, how, plan.trace, drain)
        metrics.write_requests(out / f"requests_{how}.csv", runs[how].served)
    rows = demo.table(runs, plan)
    text = demo.format_table(rows)
    print("\n" + text)
    (out / "demo.md").write_text(text + "\n")
    demo.plot(runs, plan, out / "demo.png")
    names = ", ".join(f"requests_{how}.csv" for how in RUNS)
    demo.say(f"\nwrote {out}/demo.png, demo.md, {names}")
    return rows


def calibrate(tokenizer: Tokenizer, replicas: int) -> float:
    """Requests per second the gateway gets out of the backends with full batches."""
    burst = [TraceRequest("calibration", 0.0, demo.INPUT_TOKENS, demo.OUTPUT_TOKENS)]
    burst *= 2 * demo.BATCH * replicas
    result = serve_fleet(tokenizer, replicas, "gateway", burst, None, progress=False)
    return len(result.served) / result.wall_s


def serve_fleet(
    tokenizer: Tokenizer,
    replicas: int,
    how: str,
    trace: list[TraceRequest],
    drain: float | None,
    progress: bool = True,
) -> ReplayResult:
    """Fresh backends; the trace replayed through the fair gateway or the round-robin one."""
    with backends(replicas) as urls:
        if how == "gateway":  # one VTC for the fleet, each budget read from its /fairness
            gateway = Gateway(VTC(), backends_of(urls), tokenizer, "minivtc-tiny", Auth(None))
        else:  # the field's router: at once, in turn; each backend's own VTC orders its queue
            fleet = [Backend(url, UNLIMITED) for url in urls]
            gateway = Gateway(
                FCFS(), fleet, tokenizer, "minivtc-tiny", Auth(None), route=RoundRobin()
            )
        with BackgroundServer(make_gateway(gateway)) as url:
            result = run_replay(url, trace, drain_s=drain, progress=progress)
    if result.failed:
        demo.say(f"  failed requests: {dict(result.failed)}")
    return result


@contextlib.contextmanager
def backends(n: int) -> Iterator[list[str]]:
    """`n` `minivtc serve` processes (VTC, `demo.BATCH` requests of KV, one torch thread each,
    eager so that the demo starts at once): their own processes, so that no backend shares
    Python's lock with the gateway."""
    kv_tokens = demo.BATCH * (demo.INPUT_TOKENS + demo.OUTPUT_TOKENS)
    ports = [free_port() for _ in range(n)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "minivtc", "serve", "--scheduler", "vtc", "--enforce-eager"]
    procs = [
        subprocess.Popen(
            [*args, "--port", str(port), "--kv-tokens", str(kv_tokens)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for port in ports
    ]
    try:
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        for url, proc in zip(urls, procs, strict=True):
            wait_healthy(url, START_S, proc)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()
