"""Figure 12 (response time of four real-trace clients), Figures 13-14 (RPM thresholds:
response time and the throughput they waste) and Figure 15 (the ablation on the pool size and
the request length): the paper's experiments that are not one workload under several
schedulers. Each writes its figures to `out` and returns its REPORT.md section (`report.py`
runs them); `show`: each simulation's progress bar.

Figure 15 runs on Llama-2-13B on an A100, whose step time (`a100-llama13b`) is fitted to the
artifact's four measured runs of it, two pool sizes (`calibrate.fit_runs`); `fig15` draws the
measured and simulated gaps together, and `validation.py` sets each measured run beside its
simulation (`simulate_ablation`). Lesson 6 explains what the figure shows and why its gap
swings.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from minivtc.experiments import plots
from minivtc.fairness.cost import fairness_bound
from minivtc.sim import metrics
from minivtc.sim.simulator import SimResult, simulate
from minivtc.sim.step_time import A100_RUNS
from minivtc.sim.workloads import TraceRequest, uniform, workload

__all__ = ["A100_RUNS", "ABLATION", "Ablation", "ablation_gap", "fig12", "fig13_14", "fig15"]
__all__ += ["simulate_ablation"]


def fig12(out: Path, show: bool = False) -> list[str]:
    """Figure 12: response time of four real-trace clients, two medium and the two heaviest."""
    trace = workload("real").make()
    counts: dict[str, int] = {}
    for t in trace:
        counts[t.client] = counts.get(t.client, 0) + 1
    ranked = sorted(counts, key=lambda c: (counts[c], c))  # ascending request count
    shown = [ranked[i] for i in (12, 13, 25, 26)]
    lines = [
        "## Figure 12: real trace, response time of four clients",
        "",
        f"Clients of ascending-count ranks 12, 13 (medium) and 25, 26 (heaviest): "
        f"{', '.join(f'`{c}` ({counts[c]} requests)' for c in shown)}.",
        "",
        "| scheduler | " + " | ".join(shown) + " |",
        "| --- |" + " --- |" * len(shown),
    ]
    ttfts = {}
    for name in ("fcfs", "vtc"):
        served = simulate(trace, name, progress=show).served
        ttfts[name] = metrics.mean_ttft(served)
        lines.append(f"| {name} | " + " | ".join(f"{ttfts[name][c]:.1f} s" for c in shown) + " |")
        mine = [r for r in served if r.client in shown]
        path = out / f"fig12_response_{name}.png"
        plots.response_plot(mine, 600, path, f"fig12: {name}, mean time to first token")
    v, f = ttfts["vtc"], ttfts["fcfs"]
    ok = max(v[c] for c in shown[:2]) < 0.25 * min(v[c] for c in shown[2:]) and min(
        f[c] for c in shown[:2]
    ) > 4 * max(v[c] for c in shown[:2])
    lines += [
        "",
        "Paper: VTC medium clients 2.9 s and 3.4 s, heavy 135 s and 68 s; FCFS 77, 55, 58, 46 s.",
        "",
        f"**Verdict:** under VTC only the heavy clients wait; under FCFS everyone "
        f"does: {'yes' if ok else 'NO'}.",
        "",
        "![fig12 fcfs](fig12_response_fcfs.png)",
        "![fig12 vtc](fig12_response_vtc.png)",
        "",
    ]
    return lines


RPM_PAPER = {
    5: (0.2, 340, 581),
    10: (0.5, 532, 900),
    15: (1.7, 626, 1053),
    20: (3.7, 694, 1158),
    30: (19.9, 747, 1324),
}  # threshold: (mean TTFT s, tokens/s, served of 1500)


def fig13_14(out: Path, show: bool = False) -> list[str]:
    """RPM thresholds on the real trace: response time (Fig. 13) and throughput (Fig. 14)."""
    from minivtc.experiments.plots import plt, save

    trace = workload("real").make()
    lines = [
        "## Figures 13-14: RPM thresholds on the real trace",
        "",
        "| scheduler | mean TTFT | tokens/s | served of 1500 | paper: TTFT / tokens/s / served |",
        "| --- | --- | --- | --- | --- |",
    ]
    thr = {}
    for limit, (p_ttft, p_thr, p_served) in RPM_PAPER.items():
        r = simulate(trace, f"rpm:{limit}", progress=show)
        ttft = mean_of(r.served)
        thr[limit] = metrics.table_metrics(r.served, r.total_time).throughput
        lines.append(
            f"| rpm:{limit} | {ttft:.1f} s | {thr[limit]:.0f} | {len(r.served)} | "
            f"{p_ttft} s / {p_thr} / {p_served} |"
        )
    r = simulate(trace, "vtc", progress=show)
    vtc = metrics.table_metrics(r.served, r.total_time).throughput
    lines.append(
        f"| vtc | {mean_of(r.served):.1f} s | {vtc:.0f} | {len(r.served)} | - / 779 / 1500 |"
    )
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(list(thr), list(thr.values()), "o-", label="RPM(threshold)")
    ax.axhline(vtc, color="C1", linestyle="--", label=f"VTC ({vtc:.0f})")
    ax.set(
        xlabel="requests per minute per client",
        ylabel="tokens/s",
        title="fig14: throughput under RPM limits",
    )
    ax.legend()
    save(fig, out / "fig14_throughput.png")
    rising = all(a < b for a, b in itertools.pairwise(thr.values()))
    ok = rising and max(thr.values()) < vtc
    lines += [
        "",
        "**Verdict:** every RPM threshold wastes capacity (throughput rises with the "
        f"threshold and stays below VTC's): {'yes' if ok else 'NO'}.",
        "",
        "![fig14](fig14_throughput.png)",
        "",
    ]
    return lines


def mean_of(served: list[metrics.Served]) -> float:
    return sum(r.first_token_latency_s for r in served) / len(served)


@dataclass(frozen=True)
class Ablation:
    """One run of Section 5.4's ablation: VTC on Llama-2-13B, an A100-80G, two clients arriving
    uniformly for 600 s, every request `length` prompt and `length` output tokens."""

    pool: int  # KV pool, tokens (M)
    rates: tuple[float, float]  # requests/s of each client
    length: int
    paper: tuple[float, float]  # the artifact's measured run (Figure 15): max / mean gap, k
    measured: str | None = None  # its measured run in data/a100_runs, if there is one

    @property
    def num_x(self) -> int:
        return 50 if self.length == 512 else 20  # the artifact's plotting script for Figure 15


ABLATION = {
    "pool 35000, 512/512": Ablation(
        35000, (1.5, 3.0), 512, (50.5, 22.1), "sec6.4_35000_VTC-512__overload-s4"
    ),
    "pool 65000, 512/512": Ablation(
        65000, (2.0, 4.0), 512, (89.4, 40.2), "sec6.4_65000_VTC-512__overload-s4"
    ),
    "pool 35000, 256/256": Ablation(
        35000, (3.0, 6.0), 256, (32.0, 13.0), "sec6.4_35000_VTC-256__overload-s4"
    ),
    "pool 35000, 768/768": Ablation(
        35000, (1.0, 2.0), 768, (50.3, 21.7), "sec6.4_35000_VTC-768__overload-s4"
    ),
}


def simulate_ablation(run: Ablation, show: bool = False) -> SimResult:
    """VTC as the artifact counts and admits (every 10 decode steps), on the fitted
    `a100-llama13b` step time; the measured run's own arrivals where there is one (the
    artifact's generator draws its offsets from NumPy, `workloads.uniform` from `random`)."""
    if run.measured:
        measured = metrics.read_requests(A100_RUNS / f"{run.measured}.csv")
        trace = [
            TraceRequest(r.client, r.arrival_s, r.input_tokens, r.output_tokens) for r in measured
        ]
    else:
        trace = uniform(list(run.rates), 600, lengths=(run.length, run.length))
    return simulate(
        trace, "vtc-artifact", "a100-llama13b", kv_tokens=run.pool, admit_every=10, progress=show
    )


def ablation_gap(served: list[metrics.Served], run: Ablation) -> tuple[list[float], list[float]]:
    """Figure 15's metric: the accumulated gap over 600 s, requests ending before 120 s skipped."""
    return metrics.accumulated_service_diff(served, 600, num_x=run.num_x, skip_before=120)


def fig15(out: Path, show: bool = False) -> list[str]:
    """The ablation: the gap grows with the pool M and the request length (Section 5.4)."""
    lines = [
        "## Figure 15: ablation on the pool size and the request length",
        "",
        "Llama-2-13B on an A100-80G (`a100-llama13b`, fitted to the measured runs), VTC as the "
        "artifact counts and admits (`vtc-artifact`, admission every 10 decode steps), 600 s; "
        "requests ending before 120 s skipped, as the paper does.",
        "",
        "| run | simulated max / mean acc. gap | measured | artifact's runs | 2U |",
        "| --- | --- | --- | --- | --- |",
    ]
    gaps, curves = {}, {}
    for name, run in ABLATION.items():
        ticks, g = ablation_gap(simulate_ablation(run, show).served, run)
        gaps[name], curves[name + " simulated"] = (max(g), sum(g) / len(g)), (ticks, g)
        seen = "-"
        if run.measured:
            ticks, m = ablation_gap(metrics.read_requests(A100_RUNS / f"{run.measured}.csv"), run)
            curves[name + " measured"] = ticks, m
            seen = f"{max(m) / 1e3:.1f}k / {sum(m) / len(m) / 1e3:.1f}k"
        lines.append(
            f"| {name} | {gaps[name][0] / 1e3:.1f}k / {gaps[name][1] / 1e3:.1f}k | {seen} | "
            f"{run.paper[0]}k / {run.paper[1]}k | {2 * fairness_bound(run.length, run.pool) / 1e3:.0f}k |"
        )
    pool_ok = gaps["pool 65000, 512/512"][1] > gaps["pool 35000, 512/512"][1]
    length_ok = gaps["pool 35000, 512/512"][1] > gaps["pool 35000, 256/256"][1]
    panels = {
        "(a) pool size, 512/512": {k: v for k, v in curves.items() if "512/512" in k},
        "(b) request length, pool 35000": {k: v for k, v in curves.items() if "35000" in k},
    }
    plots.ablation_plot(panels, out / "fig15_gap.png")
    lines += [
        "",
        f"**Verdict:** a larger pool gives a larger gap: {'yes' if pool_ok else 'NO'}; "
        f"longer requests give a larger gap (512 vs 256): {'yes' if length_ok else 'NO'}.",
        "",
        "![fig15](fig15_gap.png)",
        "",
    ]
    return lines
