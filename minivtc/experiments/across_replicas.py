"""`minivtc reproduce --only replicas`: fairness across replicas, global against per-replica
counters, as a section of REPORT.md with its figures (Appendix C.3's future work).

Owns the experiment: the two constructed workloads (`replica_workloads.py`) at 8 replicas under the
global dispatcher (least-loaded and prefix-aware) and the field's four routings, each replica
with its own VTC; "affinity" again at 64 replicas, global with prefix-aware routing against
cache affinity. Each row: the tenants' service rates, the worst backlogged gap over the fleet
(`FleetWatch`, `sim/backlog.py`) and the global dispatcher's 2U, asserted after every event of
its runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from minivtc.experiments import plots
from minivtc.fleet.replica_workloads import FLEET_WORKLOADS
from minivtc.fleet.replicas import simulate_fleet
from minivtc.sim import metrics
from minivtc.sim.metrics import Served

__all__ = ["FAIR", "Row", "TENANTS", "replicas", "run_row", "table", "verdicts"]

ROUTES = [
    ("global", "least-loaded"),
    ("global", "prefix"),
    ("round-robin", None),
    ("least-loaded", None),
    ("random", None),
    ("prefix", None),
]
AT_64 = [("global", "prefix"), ("prefix", None)]  # the headline pair; 64 replicas take ~1 min each
FAIR = {"affinity": 1.0, "weighted": 4.0}  # the first tenant's fair share over the second's
TENANTS = {"affinity": ("system", "flood"), "weighted": ("gold", "free")}


@dataclass
class Row:
    n: int
    workload: str
    label: str  # the routing, and the global dispatcher's route
    first: float  # the first tenant's service rate (system, gold), tokens/s
    second: float  # the second's (flood, free)
    gap: float
    bound: float | None  # 2U (plus the staleness term): the global runs'
    served: list[Served]
    seen: dict[int, list[str]]  # replica -> the tenants it served
    throughput: float  # prompt and output tokens a second, over the whole run

    @property
    def ratio(self) -> float:
        return self.first / self.second


def replicas(out: Path, show: bool = False) -> list[str]:
    runs = [(8, name, route) for name in TENANTS for route in ROUTES]
    rows = [
        run_row(n, name, *route) for n, name, route in runs + [(64, "affinity", r) for r in AT_64]
    ]
    bounds = {(r.n, r.workload): r.bound for r in reversed(rows) if r.bound is not None}
    return intro() + table(rows, bounds) + verdicts(rows, bounds) + figures(rows, bounds, out)


def intro() -> list[str]:
    return [
        "## Fair across replicas: one dispatcher against per-replica counters",
        "",
        "Real engines on one virtual clock (A10G model, 10,000 KV tokens each, 120 s). "
        "*global*: the fair dispatcher holding every tenant's queue and counter, binding a "
        "request only where it fits (then least-loaded or prefix-aware); the others route at "
        "arrival to replicas that queue behind their own VTC. Service: tokens/s (w_p = 1, "
        "w_q = 2) over 30-120 s; *gap*: the worst backlogged |W_f - W_g| over the fleet; "
        "*2U*: the global dispatcher's bound with M the fleet's memory, asserted after every "
        "event of its runs.",
        "",
    ]


def table(rows: list[Row], bounds: dict[tuple[int, str], float]) -> list[str]:
    """The rows as a markdown table, each with the 2U of its (N, workload) from `bounds`."""
    lines = [
        "| N | workload | routing | first : second tenant | ratio (fair) | gap | 2U |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        bound = bounds[(r.n, r.workload)]
        lines.append(
            f"| {r.n} | {r.workload} | {r.label} | {r.first:.0f} : {r.second:.0f} | "
            f"{r.ratio:.2f} ({FAIR[r.workload]:.0f}) | {r.gap:,.0f} | {bound:,.0f} |"
        )
    return lines


def run_row(
    n: int, name: str, routing: str, route_by: str | None = None, staleness: float = 0.0
) -> Row:
    """One run of workload `name` on `n` replicas: `routing` "global" is the dispatcher (routing
    by `route_by`, least-loaded by default), else the field's router in front of per-replica
    VTC; `staleness`: how late the dispatcher hears of each step (`staleness.News`)."""
    w = FLEET_WORKLOADS[name]
    fleet = simulate_fleet(
        w.make(n),
        n,
        routing,
        route_by or "least-loaded",
        weights=w.weights,
        check_fairness=routing == "global",
        watch_backlog=True,
        staleness=staleness,
    )
    result = fleet.result
    rates = metrics.service(result.served, 30.0, w.duration)
    first, second = (rates.get(c, 0.0) / (w.duration - 30) for c in TENANTS[name])
    label = routing + (f", {route_by}" if route_by and routing == "global" else "")
    gap = result.backlogged_gap or 0.0  # (the fleet's watch always measures it)
    seen: dict[int, set[str]] = {}
    for s, k in zip(result.served, fleet.replicas, strict=True):
        seen.setdefault(k, set()).add(s.client)
    tokens = sum(s.input_tokens + s.output_tokens for s in result.served)
    return Row(
        n,
        name,
        label,
        first,
        second,
        gap,
        result.bound,
        result.served,
        {k: sorted(v) for k, v in sorted(seen.items())},
        tokens / result.total_time,
    )


def verdicts(rows: list[Row], bounds: dict) -> list[str]:
    lines = ["", "**Verdicts:**", ""]
    for r in rows:
        if r.label.startswith("global"):
            fair = abs(r.first / r.second / FAIR[r.workload] - 1) < 0.1
            ok = "yes" if fair and r.bound is not None and r.gap <= r.bound else "NO"
            lines.append(
                f"- N = {r.n}, {r.workload}, {r.label}: its fair share, gap within 2U: {ok};"
            )
    broken = all(r.gap > bounds[(r.n, r.workload)] for r in rows if r.label == "prefix")
    lines.append(f"- cache affinity with per-replica VTC breaks 2U: {'yes' if broken else 'NO'}.")
    return lines + [""]


def figures(rows: list[Row], bounds: dict, out: Path) -> list[str]:
    """Service over time, global (prefix-aware) against cache affinity; the gap plots."""
    lines = []
    for r in rows:
        if r.label in ("global, prefix", "prefix"):
            path = out / f"replicas_{r.n}_{r.workload}_{r.label.replace(', ', '_')}.png"
            title = f"{r.n} replicas, {r.workload}, {r.label}: service rate"
            plots.service_plot(r.served, 120.0, path, title)
            lines.append(f"![{r.n} {r.workload} {r.label}]({path.name})")
    for n, name in sorted(bounds):
        runs = {r.label: r.served for r in rows if (r.n, r.workload) == (n, name)}
        path = out / f"replicas_{n}_{name}_gap.png"
        plots.gap_plot(runs, 120.0, path, bound=bounds[(n, name)])
        lines.append(f"![{n} {name} gap]({path.name})")
    return lines + [""]
