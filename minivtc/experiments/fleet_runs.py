"""A fleet simulation with its outputs on disk: `minivtc simulate --replicas N`.

Owns which files a fleet run writes: requests.csv (the single-engine columns and `replica`,
the replica each request ran on), metrics.json (the fleet as one, as `experiments/report.py`
summarizes a single engine's run, plus the routing and a table per replica) and the service
and gap plots. The simulation itself is `replicas.py`'s. Also `dynamo_table`, Dynamo's
two-router experiment through k gateways (`gateways.py`). minivtc/fleet/README.md; Lesson 14.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, replace
from pathlib import Path

from minivtc.engine.engine_config import EngineConfig
from minivtc.experiments import plots
from minivtc.experiments.report import summarize
from minivtc.fleet.gateways import GatewaySpec
from minivtc.fleet.replica_workloads import FLEET_WORKLOADS, fleet_workload, scaled
from minivtc.fleet.replicas import FleetResult, simulate_fleet
from minivtc.sim import metrics
from minivtc.sim.metrics import Served
from minivtc.sim.workloads import WORKLOADS, read_trace

__all__ = ["dynamo_table", "simulate_fleet_to_dir"]


def simulate_fleet_to_dir(
    source: str,
    config: EngineConfig,
    step_time: str,
    out: str | Path,
    replicas: int,
    routing: str | GatewaySpec,
    route_by: str,
    staleness: float = 0.0,
) -> dict:
    """Simulate `source` (a workload's name, `replica_workloads.fleet_workload`, or a trace
    file's path; arrivals scaled by the number of replicas) on `replicas` replicas, write the
    files to `out`; the global dispatcher asserts its bound after every event (VTC)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if source in WORKLOADS or source in FLEET_WORKLOADS:
        trace, horizon, weights = fleet_workload(source, replicas)
    else:
        trace, weights = scaled(read_trace(source), replicas), None
        horizon = float(int(trace[-1].arrival_s))
    scheduler, kv_tokens = str(config.policy), config.pool_tokens
    checked = routing == "global" and scheduler.startswith(("vtc", "wvtc"))
    fleet = simulate_fleet(
        trace,
        replicas,
        routing,
        route_by,
        replace(config, weights=weights, check_fairness=checked),
        step_time,
        watch_backlog=True,
        staleness=staleness,
    )
    write_requests(out / "requests.csv", fleet)
    summary = summarize(
        fleet.result, horizon, kv_tokens * replicas, max(t.input_tokens for t in trace)
    )
    summary.update(
        workload=source,
        replicas=replicas,
        routing=routing if isinstance(routing, str) else "gateways",
        route_by=route_by if routing == "global" else None,
        scheduler=scheduler,
        step_time=step_time,
        kv_tokens_per_replica=kv_tokens,
        staleness_s=staleness,
        gateways=None if isinstance(routing, str) else asdict(routing),
        per_replica=per_replica(fleet),
    )
    # the constructed workloads' comparison window: from 30 s (both backlogged) to the horizon
    span = metrics.service(fleet.result.served, 30.0, horizon)
    summary["service_rate_30_end"] = {c: round(v / (horizon - 30), 1) for c, v in span.items()}
    (out / "metrics.json").write_text(json.dumps(summary, indent=1) + "\n")
    name = summary["routing"]
    title = f"{scheduler}, {replicas} replicas, {name} on {Path(source).name}"
    served = fleet.result.served
    plots.service_plot(served, horizon, out / "service.png", f"{title}: service rate")
    plots.gap_plot({name: served}, horizon, out / "gap.png", bound=fleet.result.bound)
    return summary


def write_requests(path: Path, fleet: FleetResult) -> None:
    """requests.csv: `metrics.write_requests`'s columns, then `replica`."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*metrics.COLUMNS, metrics.CACHED, "replica"])
        for r, k in zip(fleet.result.served, fleet.replicas, strict=True):
            w.writerow(
                [
                    r.client,
                    f"{r.arrival_s:.6f}",
                    r.input_tokens,
                    r.output_tokens,
                    f"{r.first_token_latency_s:.6f}",
                    f"{r.request_latency_s:.6f}",
                    r.cached_tokens,
                    k,
                ]
            )


def per_replica(fleet: FleetResult) -> list[dict]:
    """Per replica: requests served, service (linear price), clients served, mean TTFT."""
    rows: list[list[Served]] = [[] for _ in range(fleet.num_replicas)]
    for r, k in zip(fleet.result.served, fleet.replicas, strict=True):
        rows[k].append(r)
    return [
        {
            "replica": k,
            "served": len(served),
            "service": round(sum(metrics.linear_cost(r) for r in served), 1),
            "clients": len({r.client for r in served}),
            "mean_ttft_s": round(sum(r.first_token_latency_s for r in served) / len(served), 3)
            if served
            else None,
        }
        for k, served in enumerate(rows)
    ]


ROWS = [("one gateway", 1, "balanced"), ("balanced", 0, "balanced")]
ROWS += [("skewed", 0, "skewed"), ("swapped", 0, "swapped")]


def dynamo_table(n: int, k: int, sync_s: float, step_time: str = "a10g-llama7b") -> str:
    """Dynamo's two-router experiment (its issue #15187) at n replicas and k gateways: the
    "pair" workload (w4 : w1 weighted 4:1, equal-cost requests), rows one gateway, k with
    balanced, skewed and swapped ingress, each without and with the store. A markdown table:
    service in tokens/s over 30-120 s (both backlogged), the worst backlogged gap, the bound."""
    work = FLEET_WORKLOADS["pair"]
    trace, horizon = work.make(n), work.duration
    lines = [
        f"| {n} replicas, gateways | store (tau {sync_s:g} s) | w4 : w1 (tokens/s) | ratio "
        "| backlogged gap | bound 2U + 2 Delta + 2S |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, rows_k, ingress in ROWS:
        for store in (None, sync_s):
            gateways = GatewaySpec(rows_k or k, ingress, store)
            fleet = simulate_fleet(
                trace, n, gateways, step_time=step_time, weights=work.weights, watch_backlog=True
            )
            got = metrics.service(fleet.result.served, 30.0, horizon)
            w4, w1 = (got[c] / (horizon - 30.0) for c in ("w4", "w1"))
            bound = fleet.result.bound
            lines.append(
                f"| {name if rows_k else f'{k}, {name}'} | {'yes' if store is not None else 'no'} "
                f"| {w4:.0f} : {w1:.0f} | {w4 / w1 if w1 else math.inf:.2f} "
                f"| {fleet.result.backlogged_gap:,.0f} "
                f"| {'none claimed' if bound is None else f'{bound:,.0f}'} |"
            )
    return "\n".join(lines)
