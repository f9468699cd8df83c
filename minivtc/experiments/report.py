"""Experiment runs with their outputs on disk: `simulate` to a directory, and `reproduce`.

Owns the glue between a simulation (`sim/simulator.py`), the metrics (`sim/metrics.py`) and the
plots (`plots.py`): which files a run writes, and what metrics.json holds (`summarize`: Table 2's
metrics, Section 5.1, the paper's Figure 3 gap, Theorem 4.4's backlogged gap beside the bound the
configuration guarantees, and the run's size; one engine's run and each replica of a fleet's,
`fleet_runs.py`, are summarized alike); running the paper's experiments (`paper_table.py` lists
them) into REPORT.md, with the ones that are not "one workload, several schedulers"
(`figures.py`, `fair_memory.py`, `prefix_caching.py`) and the validation against the artifact's
measured A10G runs (and, `validation.validate_a100`, its measured A100 runs of Figure 15). The
command line calls it.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from minivtc.engine.engine_config import EngineConfig
from minivtc.experiments import plots
from minivtc.experiments.across_replicas import replicas
from minivtc.experiments.fair_memory import fair_memory
from minivtc.experiments.figures import fig12, fig13_14, fig15
from minivtc.experiments.paper_table import EXPERIMENTS, TWO_U_10K, Experiment
from minivtc.experiments.prefix_caching import prefix_caching
from minivtc.experiments.validation import validate_a100
from minivtc.fairness.cost import fairness_bound
from minivtc.sim import metrics
from minivtc.sim.simulator import SimResult, progress_bar, simulate
from minivtc.sim.workloads import A10G_RUNS, WORKLOADS, TraceRequest, read_trace, workload

__all__ = ["SPECIAL", "measured_trace", "reproduce", "simulate_to_dir", "summarize"]


def simulate_to_dir(source: str, config: EngineConfig, step_time: str, out: str | Path) -> dict:
    """Simulate `source` (a workload's name, `workloads.WORKLOADS`, or a trace file's path;
    a workload's weights replace the config's), then write requests.csv, metrics.json and the
    plots to `out`. VTC asserts its bound after every step where the configuration states
    one (`bound` in metrics.json: 2U with a reservation, 2 U_P with fair preemption, null
    otherwise)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if source in WORKLOADS:
        w = workload(source)
        trace, horizon, weights = w.make(), w.duration, w.weights
    else:
        trace = read_trace(source)
        horizon, weights = float(int(trace[-1].arrival_s)), None
    reservation, victim = config.reservation, config.victim or "latest"
    checked = config.policy == "vtc" and (reservation == "full" or config.fair_victim)
    config = replace(config, weights=weights, check_fairness=checked)
    result = simulate(trace, config, step_time, watch_backlog=True, progress=True)
    scheduler, kv_tokens = str(config.policy), config.pool_tokens
    metrics.write_requests(out / "requests.csv", result.served)
    summary = summarize(result, horizon, kv_tokens, max(t.input_tokens for t in trace))
    summary.update(
        workload=source,
        scheduler=scheduler,
        step_time=step_time,
        kv_tokens=kv_tokens,
        reservation=reservation,
        victim=victim,
        preempt_gap=config.preempt_gap,
        block_size=config.block_size,
        preemption=config.preemption or "recompute",
        swap_tokens=config.swap_tokens,
        prefix_caching=config.prefix_caching,
        cached_weight=config.cached_weight,
    )
    (out / "metrics.json").write_text(json.dumps(summary, indent=1) + "\n")
    title = f"{scheduler} on {Path(source).name}"
    plots.service_plot(result.served, horizon, out / "service.png", f"{title}: service rate")
    plots.response_plot(result.served, horizon, out / "response.png", f"{title}: response time")
    plots.gap_plot({scheduler: result.served}, horizon, out / "gap.png", bound=summary["two_u"])
    return summary


def summarize(
    result: SimResult,
    horizon: float,
    kv_tokens: int,
    max_input: int,
    cost: metrics.Cost = metrics.linear_cost,
) -> dict:
    """metrics.json's numbers. `cost` prices service (the "profile" tables use h; their demand
    stays linear, as in the artifact's script for Tables 3-4)."""
    served = result.served
    table = metrics.table_metrics(served, result.total_time, horizon=horizon, cost=cost)
    totals = metrics.service(served, 0.0, float("inf"), cost)
    _, gaps = metrics.accumulated_service_diff(served, horizon, cost=cost)
    half = len(gaps) // 2
    return {
        "served": len(served),
        "rejected": len(result.rejected),
        "max_diff": round(table.max_diff, 2),
        "avg_diff": round(table.avg_diff, 2),
        "diff_var": round(table.diff_var, 2),
        "throughput_tok_s": round(table.throughput, 1),
        # 1 = every client got the same service over the measured span (after the warm-up)
        "jain_index": round(
            metrics.jain_index(metrics.service(served, 30.0, horizon, cost).values()), 4
        ),
        # the paper's Figure 3 gap, over every client, idle ones too: 2U does not bound it
        # (a client that asks for little falls behind by its own choice); backlogged_gap below
        # is what the bound is about
        "max_accumulated_gap": round(max(gaps), 1),
        "max_gap_first_half": round(max(gaps[:half] or gaps), 1),
        "last_gap": round(gaps[-1], 1),
        "two_u": 2 * fairness_bound(max_input, kv_tokens),
        "simulated_s": round(result.total_time, 1),
        "wall_s": round(result.wall_s, 2),
        "steps": result.steps,
        # Theorem 4.4's quantity, measured, and the bound the configuration guarantees it
        # (null: none stated, e.g. FCFS, or blocks on demand with the latest victim)
        "backlogged_gap": None
        if result.backlogged_gap is None
        else round(result.backlogged_gap, 1),
        "bound": None if result.bound is None else round(result.bound, 1),
        "prefix_hit_rate": round(result.prefix_hit_rate, 4),  # of admitted prompt tokens
        "prefill_tokens_saved": result.cached_tokens,
        "preemptions": result.preemptions,
        "recomputed_tokens": result.recomputed_tokens,
        "swapped_tokens": result.swapped_tokens,
        "service_per_client": {c: round(v, 1) for c, v in totals.items()},
        # the paper's comparison window for shares (e.g. Fig. 16, Table 6: 60-300 s), tokens/s
        "service_rate_60_300": {
            c: round(v / 240, 1) for c, v in metrics.service(served, 60, 300, cost).items()
        },
        "mean_ttft_per_client": {c: round(v, 3) for c, v in metrics.mean_ttft(served).items()},
    }


def measured_trace(config: dict) -> list[TraceRequest]:
    """The trace the artifact generated for a measured run, from its config (index.json)."""
    from minivtc.sim.workloads import uniform

    if config["num_adapters"] == -1:
        return workload("real").make()
    on_off = config["on_off"] if config["on_off"] > 0 else None
    return uniform(config["req_rate"], config["duration"], on_off=on_off)


def validate(out: Path) -> list[str]:
    """The simulator against the artifact's measured A10G runs (data/a10g_runs): the same
    trace, scheduler and admission cadence (`vtc-artifact` or `fcfs`, admission every 10 decode
    steps, as the artifact's router does; lessons/artifact_deviations.md). Compared: throughput, and each client's service over the trace's
    600 s (clients with at least 5% of the largest one's; afterwards a backlog drains, and over
    all time every client's total is the same in both). Then the measured A100 runs of the
    ablation and the 65000-token ones its step time was not fitted to
    (`validation.validate_a100`)."""
    runs_dir = A10G_RUNS
    index = json.loads((runs_dir / "index.json").read_text())
    lines = [
        "## Validation: the simulator against the measured A10G runs",
        "",
        "| run | measured tokens/s | simulated | error | clients compared | worst client's "
        "service error |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    worst_throughput = worst_service = 0.0
    for run in index:
        name = run["run"]
        scheduler = {"VTC": "vtc-artifact", "FCFS": "fcfs"}[name.split("__")[0]]
        measured = metrics.read_requests(runs_dir / f"{name}.csv")
        result = simulate(
            measured_trace(run["config"]), scheduler, admit_every=10, progress=show_simulations()
        )
        want = metrics.table_metrics(measured, run["total_time_s"]).throughput
        got = metrics.table_metrics(result.served, result.total_time).throughput
        served_m = metrics.service(measured, 0, 600)
        served_s = metrics.service(result.served, 0, 600)
        big = [c for c in served_m if served_m[c] >= 0.05 * max(served_m.values())]
        errors = {c: served_s.get(c, 0.0) / served_m[c] - 1 for c in big}
        client = max(errors, key=lambda c: abs(errors[c]))
        worst_throughput = max(worst_throughput, abs(got / want - 1))
        worst_service = max(worst_service, abs(errors[client]))
        lines.append(
            f"| {name} ({scheduler}) | {want:.0f} | {got:.0f} | {got / want - 1:+.1%} | "
            f"{len(big)} | {errors[client]:+.1%} (`{client}`) |"
        )
    ok = worst_throughput <= 0.10 and worst_service <= 0.10
    lines += [
        "",
        f"**Verdict:** throughput within 10% on every run (worst {worst_throughput:.1%}) "
        f"and each client's service within 10% (worst {worst_service:.1%}): "
        f"{'yes' if ok else 'NO'}.",
        "",
    ]
    return lines + validate_a100(show_simulations())


SPECIAL: dict[str, tuple[str, Callable[[Path], list[str]]]] = {
    "fig12": (
        "Figure 12: real trace, response time of four clients",
        lambda out: fig12(out, show_simulations()),
    ),
    "fig13": (
        "Figures 13-14: RPM thresholds, response time and throughput",
        lambda out: fig13_14(out, show_simulations()),
    ),
    "fig15": (
        "Figure 15: ablation, pool size and request length (13B, A100)",
        lambda out: fig15(out, show_simulations()),
    ),
    "validate": ("Validation against the measured A10G and A100 runs", validate),
    "fair_memory": (
        "Fair memory: reservation vs blocks on demand with preemption",
        lambda out: fair_memory(out, show_simulations()),
    ),
    "prefix_caching": (
        "Prefix caching: what a cached prompt token should cost",
        lambda out: prefix_caching(out, show_simulations()),
    ),
    "replicas": (
        "Fair across replicas: one dispatcher against per-replica counters (Appendix C.3)",
        lambda out: replicas(out, show_simulations()),
    ),
}


def reproduce(out: str | Path, only: list[str] | None = None) -> Path:
    """Run the chosen experiments (all by default) and write REPORT.md with their figures."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    keys = [e.key for e in EXPERIMENTS] + list(SPECIAL)
    unknown = set(only or []) - set(keys)
    if unknown:
        raise ValueError(f"unknown experiments {sorted(unknown)}; choose from {keys}")
    chosen = [e for e in EXPERIMENTS if not only or e.key in only]
    special = [k for k in SPECIAL if not only or k in only]
    lines = [
        "# minivtc reproduces the paper",
        "",
        "Simulated with the `a10g-llama7b` step-time model (Llama-2-7B on an A10G, 10000-token "
        "pool, w_p = 1, w_q = 2), the same engine and scheduler code that serves real tokens. "
        "Metrics as in the paper's Table 2: columns Max Diff / Avg Diff / Diff Var / tokens/s.",
        "",
    ]
    steps: list[tuple[str, str, Callable[[Path], list[str]]]] = [
        (e.key, e.title, functools.partial(run_experiment, e)) for e in chosen
    ]
    steps += [(key, *SPECIAL[key]) for key in special]
    with progress_bar(len(steps), "reproducing", "experiment") as bar:
        for key, title, run in steps:
            bar.write(f"{key}: {title}", file=sys.stderr)  # above the bar, which stays last
            bar.set_postfix_str(key)
            lines += run(out)
            bar.update()
    report = out / "REPORT.md"
    report.write_text("\n".join(lines) + "\n")
    return report


def show_simulations() -> bool:
    """Whether `reproduce` shows each simulation's bar under its own: on a terminal, yes; in a
    log, where a bar inside a bar prints cursor moves and blank lines, only its own."""
    return sys.stderr.isatty()


def run_experiment(e: Experiment, out: Path) -> list[str]:
    w = workload(e.workload)
    trace = w.make()
    runs, served = {}, {}
    for name in e.schedulers:
        weights = w.weights if name == "vtc" and w.weights else None
        result = simulate(
            trace, name, weights=weights, admit_every=e.admit_every, progress=show_simulations()
        )
        served[name] = result.served
        runs[name] = summarize(
            result, w.duration, 10000, max(t.input_tokens for t in trace), e.cost
        )
    lines = [
        f"## {e.title}",
        "",
        f"Workload `{e.workload}`: {w.description}."
        + (f" Admission every {e.admit_every} decode steps." if e.admit_every > 1 else ""),
        "",
        "| scheduler | Max Diff | Avg Diff | Diff Var | tokens/s | max acc. gap |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, s in runs.items():
        lines.append(
            f"| {name} | {s['max_diff']:.2f} | {s['avg_diff']:.2f} | {s['diff_var']:.2f} | "
            f"{s['throughput_tok_s']:.0f} | {s['max_accumulated_gap'] / 1e3:.1f}k |"
        )
    lines += ["", f"Paper: {e.paper}.", "", f"**Verdict:** {e.verdict(runs)}.", ""]
    for fig in e.figures:
        for name in e.schedulers if fig != "gap" else ["all"]:
            path = out / f"{e.key}_{fig}_{name.replace(':', '')}.png"
            if fig == "gap":
                plots.gap_plot(served, w.duration, path, bound=TWO_U_10K)
            elif fig == "service":
                plots.service_plot(served[name], w.duration, path, f"{e.key}: {name} service rate")
            else:
                plots.response_plot(
                    served[name], w.duration, path, f"{e.key}: {name} response time"
                )
            lines.append(f"![{e.key} {fig} {name}]({path.name})")
    return lines + [""]
