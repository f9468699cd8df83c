"""The simulator against the artifact's measured A100 runs of Figure 15's ablation: each
measured run beside its simulation on the same arrivals (`validate_a100`: Figure 15's gap,
throughput, each client's share, the mean latencies the step time's fit is judged by), then
the three other 65000-token runs the artifact stored (`HELD_OUT`, where their records are in
the data folder), which the fit never saw. Owns the limits each comparison is held to
(`LIMITS`, `HELD_OUT_LIMITS`); the ablation itself and its figure are `figures.py`'s. Run by
`report.py` (`reproduce --only validate`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from statistics import fmean

from minivtc.experiments.figures import ABLATION, Ablation, ablation_gap, simulate_ablation
from minivtc.sim import metrics
from minivtc.sim.simulator import SimResult, simulate
from minivtc.sim.step_time import A100_RUNS
from minivtc.sim.workloads import uniform

__all__ = ["HELD_OUT", "compare", "held_out_errors", "simulate_stored", "validate_a100"]

# What the A100 validation allows: gap (relative), throughput (relative), share (points)
LIMITS = (0.20, 0.05, 0.05)


@dataclass(frozen=True)
class StoredRun:
    """A 65000-token run of Figure 15's ablation that the fit never saw (FCFS and VTC at 256
    tokens, VTC at 768), to check the `a100-llama13b` step time on batches it was not fitted
    to. Its records are the artifact's; they are read from `data/a100_runs/<stem>.csv` when
    they are there (the data folder does not hold them yet: `measured` is then None)."""

    scheduler: str  # as the simulator names it
    rates: tuple[float, float]  # requests/s of each client, for 600 s
    length: int  # prompt and output tokens of every request
    stem: str  # its records' file name in `data/a100_runs`, without ".csv"
    pool: int = 65000

    def measured(self) -> tuple[float, float] | None:
        """Throughput as Table 2 counts it (every request served, prompt + output, over the
        first send to the last token) and client-00's share; None without its records."""
        path = A100_RUNS / f"{self.stem}.csv"
        if not path.exists():
            return None
        served = metrics.read_requests(path)
        start, end = min(r.arrival_s for r in served), max(r.end_s for r in served)
        tokens = sum(r.input_tokens + r.output_tokens for r in served)
        return tokens / (end - start), share(served, "client-00")


HELD_OUT = {
    "pool 65000, 256/256, FCFS": StoredRun(
        "fcfs", (4.0, 8.0), 256, "sec6.4_65000_FCFS-256__overload-s4"
    ),
    "pool 65000, 256/256": StoredRun(
        "vtc-artifact", (4.0, 8.0), 256, "sec6.4_65000_VTC-256__overload-s4"
    ),
    "pool 65000, 768/768": StoredRun(
        "vtc-artifact", (1.5, 3.0), 768, "sec6.4_65000_VTC-768__overload-s4"
    ),
}
# What the held-out runs allow: throughput (relative), share (points)
HELD_OUT_LIMITS = (0.10, 0.05)


def validate_a100(show: bool = False) -> list[str]:
    """The simulator against the artifact's measured A100 runs of the ablation (data/a100_runs):
    the same arrivals, `simulate_ablation`. Compared: Figure 15's gap (max and mean), throughput
    over each run's whole time (the backlog drains long after the last arrival), each client's
    share of the service over the trace's 600 s, and the mean latencies the fit is judged by."""
    lines = [
        "## Validation: the simulator against the measured A100 runs (Figure 15)",
        "",
        "| run | max / mean acc. gap, measured -> simulated | tokens/s | client-00's share "
        "| mean first token | mean request |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    wall = {r["run"]: r["total_time_s"] for r in json.loads((A100_RUNS / "index.json").read_text())}
    worst: dict[int, tuple[float, str]] = {i: (0.0, "") for i in range(3)}  # gap, thr, share
    for name, run in ABLATION.items():
        if not run.measured:
            continue
        measured = metrics.read_requests(A100_RUNS / f"{run.measured}.csv")
        got = compare((measured, wall[run.measured]), simulate_ablation(run, show), run)
        for i, e in enumerate(got["errors"]):
            worst[i] = max(worst[i], (abs(e), name))
        lines.append(f"| {name} | " + " | ".join(got["cells"]) + " |")
    ok = [worst[i][0] <= LIMITS[i] for i in range(3)]
    lines += [
        "",
        f"**Verdict:** throughput within 5% (worst {worst[1][0]:.1%}) and each client's share "
        f"within 5 points (worst {100 * worst[2][0]:.1f}) on every run: "
        f"{'yes' if ok[1] and ok[2] else 'NO'}; accumulated gap within 20% on every run (worst "
        f"{worst[0][0]:.1%}, {worst[0][1]}): {'yes' if ok[0] else 'NO'}.",
        "",
    ]
    return lines + validate_held_out(show)


def validate_held_out(show: bool = False) -> list[str]:
    """The stored 65000-token runs the step time was not fitted to (`HELD_OUT`), simulated
    on `workloads.uniform` arrivals: throughput and client-00's share, where their records
    are in the data folder."""
    lines = [
        "Held out (the step time is not fitted to them): the artifact's other 65000-token runs, "
        "on `workloads.uniform` arrivals.",
        "",
        "| run | tokens/s, measured -> simulated | client-00's share |",
        "| --- | --- | --- |",
    ]
    worst, checked = [0.0, 0.0], 0
    for name, run in HELD_OUT.items():
        measured = run.measured()
        if measured is None:
            lines.append(f"| {name} | records not in data/a100_runs ({run.stem}.csv) | - |")
            continue
        errors = held_out_errors(run, simulate_stored(run, show))
        worst = [max(w, abs(e)) for w, e in zip(worst, errors, strict=True)]
        checked += 1
        lines.append(
            f"| {name} | {measured[0]:.0f} -> {measured[0] * (1 + errors[0]):.0f} "
            f"({errors[0]:+.1%}) | {measured[1]:.1%} -> {measured[1] + errors[1]:.1%} |"
        )
    if not checked:
        return lines + ["", "**Verdict:** none of their records is in the data folder.", ""]
    ok = all(w <= limit for w, limit in zip(worst, HELD_OUT_LIMITS, strict=True))
    return lines + [
        "",
        f"**Verdict:** held-out throughput within 10% (worst {worst[0]:.1%}) and each client's "
        f"share within 5 points (worst {100 * worst[1]:.1f}): {'yes' if ok else 'NO'}.",
        "",
    ]


def simulate_stored(run: StoredRun, show: bool = False) -> SimResult:
    trace = uniform(list(run.rates), 600, lengths=(run.length, run.length))
    return simulate(
        trace, run.scheduler, "a100-llama13b", kv_tokens=run.pool, admit_every=10, progress=show
    )


def held_out_errors(run: StoredRun, result: SimResult) -> tuple[float, float]:
    """Throughput (relative) and client-00's share (points), simulated against measured."""
    measured = run.measured()
    assert measured is not None, f"{run.stem}.csv is not in the data folder"
    throughput = metrics.table_metrics(result.served, result.total_time).throughput
    return throughput / measured[0] - 1, share(result.served, "client-00") - measured[1]


def compare(measured: tuple[list[metrics.Served], float], result: SimResult, run: Ablation) -> dict:
    """A measured run (its records and wall time) against its simulation: the table's cells and
    the errors checked (gap relative, the worse of max and mean; throughput relative; share in
    points)."""
    pairs = [measured, (result.served, result.total_time)]
    (_, g_m), (_, g_s) = (ablation_gap(served, run) for served, _ in pairs)
    gap_m, gap_s = (max(g_m), fmean(g_m)), (max(g_s), fmean(g_s))
    thr_m, thr_s = (metrics.table_metrics(s, t).throughput for s, t in pairs)
    share_m, share_s = (share(s, "client-00") for s, _ in pairs)
    ttft_m, ttft_s = (fmean(r.first_token_latency_s for r in s) for s, _ in pairs)
    end_m, end_s = (fmean(r.request_latency_s for r in s) for s, _ in pairs)
    gap_error = max((gap_s[i] / gap_m[i] - 1 for i in (0, 1)), key=abs)
    cells = [
        f"{gap_m[0] / 1e3:.1f}k / {gap_m[1] / 1e3:.1f}k -> {gap_s[0] / 1e3:.1f}k / "
        f"{gap_s[1] / 1e3:.1f}k ({gap_s[0] / gap_m[0] - 1:+.0%} / {gap_s[1] / gap_m[1] - 1:+.0%})",
        f"{thr_m:.0f} -> {thr_s:.0f} ({thr_s / thr_m - 1:+.1%})",
        f"{share_m:.1%} -> {share_s:.1%}",
        f"{ttft_m:.0f} -> {ttft_s:.0f} s ({ttft_s / ttft_m - 1:+.1%})",
        f"{end_m:.0f} -> {end_s:.0f} s ({end_s / end_m - 1:+.1%})",
    ]
    return {"cells": cells, "errors": (gap_error, thr_s / thr_m - 1, share_s - share_m)}


def share(served: list[metrics.Served], client: str) -> float:
    """`client`'s fraction of all service delivered over the trace's 600 s (two clients: the
    other's is one minus it)."""
    delivered = metrics.service(served, 0, 600)
    return delivered[client] / sum(delivered.values())
