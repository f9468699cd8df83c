"""Experiment runs with their outputs on disk: `simulate` to a directory, and `reproduce`.

Owns the glue between a simulation (`sim.py`), the metrics (`metrics.py`) and the plots
(`plots.py`): which files a run writes and what metrics.json holds. The command line calls it.
"""

from __future__ import annotations

import json
from pathlib import Path

from minivtc import metrics, plots
from minivtc.sim import SimResult, simulate
from minivtc.workloads import read_trace, workload


def simulate_to_dir(
    workload_name: str | None, trace_path: str | None, scheduler: str, cost_model: str,
    kv_tokens: int, seed: int, out: str | Path,
) -> dict:  # fmt: skip
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if workload_name:
        w = workload(workload_name)
        trace, horizon, weights = w.make(), w.duration, w.weights
    else:
        trace = read_trace(trace_path)
        horizon, weights = float(int(trace[-1].arrival_s)), None
    result = simulate(
        trace, scheduler, cost_model, kv_tokens, weights=weights, seed=seed, progress=True
    )
    metrics.write_requests(out / "requests.csv", result.served)
    summary = summarize(result, horizon, kv_tokens, max(t.input_tokens for t in trace))
    summary.update(workload=workload_name or trace_path, scheduler=scheduler, cost_model=cost_model,
                   kv_tokens=kv_tokens)  # fmt: skip
    (out / "metrics.json").write_text(json.dumps(summary, indent=1) + "\n")
    title = f"{scheduler} on {workload_name or Path(trace_path).name}"
    plots.service_plot(result.served, horizon, out / "service.png", f"{title}: service rate")
    plots.response_plot(result.served, horizon, out / "response.png", f"{title}: response time")
    plots.gap_plot({scheduler: result.served}, horizon, out / "gap.png", bound=summary["two_u"])
    return summary


def summarize(result: SimResult, horizon: float, kv_tokens: int, max_input: int) -> dict:
    served = result.served
    table = metrics.table_metrics(served, result.total_time, horizon=horizon)
    totals = metrics.service(served, 0.0, float("inf"))
    ttft: dict[str, list[float]] = {}
    for r in served:
        ttft.setdefault(r.client, []).append(r.first_token_latency_s)
    _, gaps = metrics.accumulated_service_diff(served, horizon)
    return {
        "served": len(served),
        "rejected": len(result.rejected),
        "max_diff": round(table.max_diff, 2),
        "avg_diff": round(table.avg_diff, 2),
        "diff_var": round(table.diff_var, 2),
        "throughput_tok_s": round(table.throughput, 1),
        # 1 = every client got the same service over the measured span (after the warm-up)
        "jain_index": round(metrics.jain_index(metrics.service(served, 30.0, horizon).values()), 4),
        "max_accumulated_gap": round(max(gaps), 1),
        "two_u": 2 * max(1.0 * max_input, 2.0 * kv_tokens),
        "simulated_s": round(result.total_time, 1),
        "wall_s": round(result.wall_s, 2),
        "steps": result.steps,
        "service_per_client": {c: round(v, 1) for c, v in totals.items()},
        "mean_ttft_per_client": {c: round(sum(v) / len(v), 3) for c, v in ttft.items()},
    }
