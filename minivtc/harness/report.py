"""Experiment runs with their outputs on disk: `simulate` to a directory, and `reproduce`.

Owns the glue between a simulation (`sim.py`), the metrics (`metrics.py`) and the plots
(`plots.py`): which files a run writes and what metrics.json holds; running the paper's
experiments (`experiments.py` lists them) into REPORT.md, with the ones that are not "one
workload, several schedulers" (Figures 12-15) and the validation against the artifact's
measured A10G runs. The command line calls it.
"""

from __future__ import annotations

import functools
import itertools
import json
import sys
from collections.abc import Callable
from pathlib import Path

from minivtc.core.cost import fairness_bound
from minivtc.harness import metrics, plots
from minivtc.harness.experiments import EXPERIMENTS, TWO_U_10K, Experiment
from minivtc.harness.fair_memory import fair_memory
from minivtc.harness.prefix_caching import prefix_caching
from minivtc.harness.sim import SimResult, progress_bar, simulate
from minivtc.harness.workloads import A10G_RUNS, TraceRequest, read_trace, workload


def simulate_to_dir(
    workload_name: str | None, trace_path: str | None, scheduler: str, step_time: str,
    kv_tokens: int, seed: int, out: str | Path, reservation: str = "peak", victim: str = "latest",
    preempt_gap: float | None = None, block_size: int = 1, prefix_caching: bool = False,
    cached_weight: float | None = None, preemption: str = "recompute",
    swap_tokens: int | None = None,
) -> dict:  # fmt: skip
    """Simulate, then write requests.csv, metrics.json and the plots to `out`. VTC asserts
    its bound after every step where the configuration states one (`bound` in metrics.json:
    2U with a reservation, 2 U_P with fair preemption, null otherwise)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if workload_name:
        w = workload(workload_name)
        trace, horizon, weights = w.make(), w.duration, w.weights
    else:
        trace = read_trace(trace_path)
        horizon, weights = float(int(trace[-1].arrival_s)), None
    checked = scheduler == "vtc" and (reservation, victim) in (("full", "latest"), ("full", "fair"),
                                                                ("none", "fair"))  # fmt: skip
    result = simulate(trace, scheduler, step_time, kv_tokens, block_size, weights=weights,
                      seed=seed, reservation=reservation, victim=victim,
                      preempt_gap=preempt_gap, check_fairness=checked, watch_backlog=True,
                      progress=True, prefix_caching=prefix_caching,
                      cached_weight=cached_weight, preemption=preemption,
                      swap_tokens=swap_tokens)  # fmt: skip
    metrics.write_requests(out / "requests.csv", result.served)
    summary = summarize(result, horizon, kv_tokens, max(t.input_tokens for t in trace))
    summary.update(workload=workload_name or trace_path, scheduler=scheduler, step_time=step_time,
                   kv_tokens=kv_tokens, reservation=reservation, victim=victim,
                   preempt_gap=preempt_gap, block_size=block_size, preemption=preemption,
                   swap_tokens=swap_tokens,
                   prefix_caching=prefix_caching, cached_weight=cached_weight)  # fmt: skip
    (out / "metrics.json").write_text(json.dumps(summary, indent=1) + "\n")
    title = f"{scheduler} on {workload_name or Path(trace_path).name}"
    plots.service_plot(result.served, horizon, out / "service.png", f"{title}: service rate")
    plots.response_plot(result.served, horizon, out / "response.png", f"{title}: response time")
    plots.gap_plot({scheduler: result.served}, horizon, out / "gap.png", bound=summary["two_u"])
    return summary


def summarize(
    result: SimResult, horizon: float, kv_tokens: int, max_input: int,
    cost: metrics.Cost = metrics.linear_cost,
) -> dict:  # fmt: skip
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
        "max_accumulated_gap": round(max(gaps), 1),
        "max_gap_first_half": round(max(gaps[:half] or gaps), 1),
        "last_gap": round(gaps[-1], 1),
        "two_u": 2 * fairness_bound(max_input, kv_tokens),
        "simulated_s": round(result.total_time, 1),
        "wall_s": round(result.wall_s, 2),
        "steps": result.steps,
        # Theorem 4.4's quantity, measured, and the bound the configuration guarantees it
        # (null: none stated, e.g. FCFS, or blocks on demand with the latest victim)
        "backlogged_gap": None if result.backlogged_gap is None else round(result.backlogged_gap, 1),
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


# --- experiments that are not "one workload, several schedulers" -----------------------------


def fig12(out: Path) -> list[str]:
    """Figure 12: response time of four real-trace clients, two medium and the two heaviest."""
    trace = workload("real").make()
    counts: dict[str, int] = {}
    for t in trace:
        counts[t.client] = counts.get(t.client, 0) + 1
    ranked = sorted(counts, key=lambda c: (counts[c], c))  # ascending request count
    shown = [ranked[i] for i in (12, 13, 25, 26)]
    lines = ["## Figure 12: real trace, response time of four clients", "",
             f"Clients of ascending-count ranks 12, 13 (medium) and 25, 26 (heaviest): "
             f"{', '.join(f'`{c}` ({counts[c]} requests)' for c in shown)}.", "",
             "| scheduler | " + " | ".join(shown) + " |", "| --- |" + " --- |" * len(shown)]  # fmt: skip
    ttfts = {}
    for name in ("fcfs", "vtc"):
        served = simulate(trace, name, progress=show_simulations()).served
        ttfts[name] = metrics.mean_ttft(served)
        lines.append(f"| {name} | " + " | ".join(f"{ttfts[name][c]:.1f} s" for c in shown) + " |")
        mine = [r for r in served if r.client in shown]
        path = out / f"fig12_response_{name}.png"
        plots.response_plot(mine, 600, path, f"fig12: {name}, mean time to first token")
    v, f = ttfts["vtc"], ttfts["fcfs"]
    ok = max(v[c] for c in shown[:2]) < 0.25 * min(v[c] for c in shown[2:]) and min(
        f[c] for c in shown[:2]) > 4 * max(v[c] for c in shown[:2])  # fmt: skip
    lines += ["", "Paper: VTC medium clients 2.9 s and 3.4 s, heavy 135 s and 68 s; FCFS 77, 55, 58, "
              "46 s.", "", f"**Verdict:** under VTC only the heavy clients wait; under FCFS everyone "
              f"does: {'yes' if ok else 'NO'}.", "",
              "![fig12 fcfs](fig12_response_fcfs.png)", "![fig12 vtc](fig12_response_vtc.png)", ""]  # fmt: skip
    return lines


RPM_PAPER = {5: (0.2, 340, 581), 10: (0.5, 532, 900), 15: (1.7, 626, 1053), 20: (3.7, 694, 1158),
             30: (19.9, 747, 1324)}  # threshold: (mean TTFT s, tokens/s, served of 1500)  # fmt: skip


def fig13_14(out: Path) -> list[str]:
    """RPM thresholds on the real trace: response time (Fig. 13) and throughput (Fig. 14)."""
    from minivtc.harness.plots import plt, save

    trace = workload("real").make()
    lines = ["## Figures 13-14: RPM thresholds on the real trace", "",
             "| scheduler | mean TTFT | tokens/s | served of 1500 | paper: TTFT / tokens/s / served |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    thr = {}
    for limit, (p_ttft, p_thr, p_served) in RPM_PAPER.items():
        r = simulate(trace, f"rpm:{limit}", progress=show_simulations())
        ttft = mean_of(r.served)
        thr[limit] = metrics.table_metrics(r.served, r.total_time).throughput
        lines.append(f"| rpm:{limit} | {ttft:.1f} s | {thr[limit]:.0f} | {len(r.served)} | "
                     f"{p_ttft} s / {p_thr} / {p_served} |")  # fmt: skip
    r = simulate(trace, "vtc", progress=show_simulations())
    vtc = metrics.table_metrics(r.served, r.total_time).throughput
    lines.append(
        f"| vtc | {mean_of(r.served):.1f} s | {vtc:.0f} | {len(r.served)} | - / 779 / 1500 |"
    )
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(list(thr), list(thr.values()), "o-", label="RPM(threshold)")
    ax.axhline(vtc, color="C1", linestyle="--", label=f"VTC ({vtc:.0f})")
    ax.set(xlabel="requests per minute per client", ylabel="tokens/s",
           title="fig14: throughput under RPM limits")  # fmt: skip
    ax.legend()
    save(fig, out / "fig14_throughput.png")
    rising = all(a < b for a, b in itertools.pairwise(thr.values()))
    ok = rising and max(thr.values()) < vtc
    lines += ["", "**Verdict:** every RPM threshold wastes capacity (throughput rises with the "
              f"threshold and stays below VTC's): {'yes' if ok else 'NO'}.", "",
              "![fig14](fig14_throughput.png)", ""]  # fmt: skip
    return lines


def mean_of(served: list[metrics.Served]) -> float:
    return sum(r.first_token_latency_s for r in served) / len(served)


ABLATION = {  # name: (pool tokens, rates, length each way); Section 5.4, A100-80G, 13B
    "pool 35000, 512/512": (35000, [1.5, 3.0], 512),
    "pool 65000, 512/512": (65000, [2.0, 4.0], 512),
    "pool 35000, 256/256": (35000, [3.0, 6.0], 256),
    "pool 35000, 768/768": (35000, [1.0, 2.0], 768),
}
ABLATION_PAPER = {"pool 35000, 512/512": (50.5, 22.1), "pool 65000, 512/512": (89.4, 40.2),
                  "pool 35000, 256/256": (32.0, 13.0), "pool 35000, 768/768": (50.3, 21.7)}  # fmt: skip


def fig15(out: Path) -> list[str]:
    """The ablation: the gap grows with the pool M and the request length (Llama-2-13B, A100;
    the `a100-llama13b` roofline is not calibrated, so compare shapes, not numbers)."""
    from minivtc.harness.workloads import uniform

    lines = ["## Figure 15: ablation on the pool size and the request length", "",
             "Llama-2-13B on an A100-80G (`a100-llama13b` roofline, uncalibrated), VTC, 600 s; "
             "requests ending before 120 s skipped, as the paper does.", "",
             "| run | max acc. gap | mean acc. gap | 2U | paper max / mean |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    gaps, served_by = {}, {}
    for name, (pool, rates, n) in ABLATION.items():
        trace = uniform(rates, 600, lengths=(n, n))
        served = simulate(
            trace, "vtc", "a100-llama13b", kv_tokens=pool, progress=show_simulations()
        ).served
        num_x = 50 if n == 512 else 20
        _, g = metrics.accumulated_service_diff(served, 600, num_x=num_x, skip_before=120)
        gaps[name] = (max(g), sum(g) / len(g))
        served_by[name] = served
        p_max, p_mean = ABLATION_PAPER[name]
        lines.append(f"| {name} | {max(g) / 1e3:.1f}k | {gaps[name][1] / 1e3:.1f}k | "
                     f"{2 * fairness_bound(n, pool) / 1e3:.0f}k | {p_max}k / {p_mean}k |")  # fmt: skip
    pool_ok = gaps["pool 65000, 512/512"][1] > gaps["pool 35000, 512/512"][1]
    length_ok = gaps["pool 35000, 512/512"][1] > gaps["pool 35000, 256/256"][1]
    plots.gap_plot({k: served_by[k] for k in ABLATION}, 600, out / "fig15_gap.png")
    lines += ["", f"**Verdict:** a larger pool gives a larger gap: {'yes' if pool_ok else 'NO'}; "
              f"longer requests give a larger gap (512 vs 256): {'yes' if length_ok else 'NO'}.", "",
              "![fig15](fig15_gap.png)", ""]  # fmt: skip
    return lines


def measured_trace(config: dict) -> list[TraceRequest]:
    """The trace the artifact generated for a measured run, from its config (index.json)."""
    from minivtc.harness.workloads import uniform

    if config["num_adapters"] == -1:
        return workload("real").make()
    on_off = config["on_off"] if config["on_off"] > 0 else None
    return uniform(config["req_rate"], config["duration"], on_off=on_off)


def validate(out: Path) -> list[str]:
    """The simulator against the artifact's measured A10G runs (data/a10g_runs): the same
    trace, scheduler and admission cadence (`vtc-artifact` or `fcfs`, admission every 10 decode
    steps, as the artifact's router does; lessons/artifact_deviations.md). Compared: throughput, and each client's service over the trace's
    600 s (clients with at least 5% of the largest one's; afterwards a backlog drains, and over
    all time every client's total is the same in both)."""
    runs_dir = A10G_RUNS
    index = json.loads((runs_dir / "index.json").read_text())
    lines = ["## Validation: the simulator against the measured A10G runs", "",
             "| run | measured tokens/s | simulated | error | clients compared | worst client's "
             "service error |", "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    worst_throughput = worst_service = 0.0
    for run in index:
        name = run["run"]
        scheduler = {"VTC": "vtc-artifact", "FCFS": "fcfs"}[name.split("__")[0]]
        measured = metrics.read_requests(runs_dir / f"{name}.csv")
        result = simulate(measured_trace(run["config"]), scheduler, admit_every=10,
                          progress=show_simulations())  # fmt: skip
        want = metrics.table_metrics(measured, run["total_time_s"]).throughput
        got = metrics.table_metrics(result.served, result.total_time).throughput
        served_m = metrics.service(measured, 0, 600)
        served_s = metrics.service(result.served, 0, 600)
        big = [c for c in served_m if served_m[c] >= 0.05 * max(served_m.values())]
        errors = {c: served_s.get(c, 0.0) / served_m[c] - 1 for c in big}
        client = max(errors, key=lambda c: abs(errors[c]))
        worst_throughput = max(worst_throughput, abs(got / want - 1))
        worst_service = max(worst_service, abs(errors[client]))
        lines.append(f"| {name} ({scheduler}) | {want:.0f} | {got:.0f} | {got / want - 1:+.1%} | "
                     f"{len(big)} | {errors[client]:+.1%} (`{client}`) |")  # fmt: skip
    ok = worst_throughput <= 0.10 and worst_service <= 0.10
    lines += ["", f"**Verdict:** throughput within 10% on every run (worst {worst_throughput:.1%}) "
              f"and each client's service within 10% (worst {worst_service:.1%}): "
              f"{'yes' if ok else 'NO'}.", ""]  # fmt: skip
    return lines


SPECIAL: dict[str, tuple[str, Callable[[Path], list[str]]]] = {
    "fig12": ("Figure 12: real trace, response time of four clients", fig12),
    "fig13": ("Figures 13-14: RPM thresholds, response time and throughput", fig13_14),
    "fig15": ("Figure 15: ablation, pool size and request length (13B, A100)", fig15),
    "validate": ("Validation against the measured A10G runs", validate),
    "fair_memory": ("Fair memory: reservation vs blocks on demand with preemption",
                    lambda out: fair_memory(out, show_simulations())),
    "prefix_caching": ("Prefix caching: what a cached prompt token should cost",
                       lambda out: prefix_caching(out, show_simulations())),
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
    lines = ["# minivtc reproduces the paper", "",
             "Simulated with the `a10g-llama7b` step-time model (Llama-2-7B on an A10G, 10000-token "
             "pool, w_p = 1, w_q = 2), the same engine and scheduler code that serves real tokens. "
             "Metrics as in the paper's Table 2: columns Max Diff / Avg Diff / Diff Var / tokens/s.", ""]  # fmt: skip
    steps = [(e.key, e.title, functools.partial(run_experiment, e)) for e in chosen]
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
        result = simulate(trace, name, weights=weights, progress=show_simulations())
        served[name] = result.served
        runs[name] = summarize(
            result, w.duration, 10000, max(t.input_tokens for t in trace), e.cost
        )
    lines = [f"## {e.title}", "", f"Workload `{e.workload}`: {w.description}.", "",
             "| scheduler | Max Diff | Avg Diff | Diff Var | tokens/s | max acc. gap |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for name, s in runs.items():
        lines.append(f"| {name} | {s['max_diff']:.2f} | {s['avg_diff']:.2f} | {s['diff_var']:.2f} | "
                     f"{s['throughput_tok_s']:.0f} | {s['max_accumulated_gap'] / 1e3:.1f}k |")  # fmt: skip
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
