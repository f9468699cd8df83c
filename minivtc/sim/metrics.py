"""The paper's fairness metrics (Section 5), exactly as its artifact's plotting code computes them.

Owns: `Served` (one row of `requests.csv`: what a client saw of one request), reading and
writing that CSV, and every number the paper reports from it — service per window, demand per
window, the absolute difference of accumulated service, mean first-token latency per window,
Table 2's Max / Avg / Var Diff and throughput — plus Jain's fairness index. Pure Python over
client-side records: a real run (load generator), a simulation and the artifact's stored A10G
runs are measured by the same code. Lessons 4 and 6 use it.

Conventions that decide the numbers (all from the artifact's scripts):
- a request's whole cost is spread uniformly over [first token, completion]: prefill is not
  attributed at the prefill instant;
- cost is w_p * input + w_q * output with w_p = 1, w_q = 2, unless another cost is passed;
- rejected (RPM) requests are not in the records, so their demand does not count as unfairness.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from minivtc.fairness.cost import LinearCost, ProfiledCost, linear_price

__all__ = ["CACHED", "COLUMNS", "Cost", "Served", "accumulated_service_diff", "charged_cost"]
__all__ += ["clients_of", "demand", "demand_rates", "jain_index", "linear_cost", "mean_ttft"]
__all__ += ["profiled_cost", "read_requests", "response_times", "service", "service_rates"]
__all__ += ["table_metrics", "write_requests"]

COLUMNS = [
    "client",
    "arrival_s",
    "input_tokens",
    "output_tokens",
    "first_token_latency_s",
    "request_latency_s",
]
CACHED = "cached_tokens"  # written after COLUMNS; optional when read (the measured runs lack it)


@dataclass(frozen=True)
class Served:
    client: str
    arrival_s: float
    input_tokens: int
    output_tokens: int
    first_token_latency_s: float  # arrival to first token: queueing + prefill (TTFT)
    request_latency_s: float  # arrival to last token
    cached_tokens: int = 0  # of input_tokens, found in the prefix cache (not computed)

    @property
    def start_s(self) -> float:
        return self.arrival_s + self.first_token_latency_s

    @property
    def end_s(self) -> float:
        return self.arrival_s + self.request_latency_s


Cost = Callable[[Served], float]


def linear_cost(r: Served) -> float:
    """The paper's price of a request's service: w_p per prompt token, w_q per output token."""
    return linear_price(r.input_tokens, r.output_tokens)


def charged_cost(w_c: float, w_p: float = 1.0, w_q: float = 2.0) -> Cost:
    """Service priced as VTC(cached_weight=w_c) charges it: a cached prompt token at w_c. With
    w_c = w_p it is `linear_cost`, what a client receives, cached or not."""
    h = LinearCost(w_p, w_q)
    return lambda r: linear_price(r.input_tokens, r.output_tokens, r.cached_tokens, h, w_c)


def profiled_cost(r: Served) -> float:
    """The artifact's fitted h in ms (Appendix B.2), for the "profile" tables: the same h
    the scheduler charges with (`cost.ProfiledCost`)."""
    return ProfiledCost()(r.input_tokens, r.output_tokens)


def read_requests(path: str | Path) -> list[Served]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and set(COLUMNS) - set(rows[0]):
        raise ValueError(f"{path}: missing columns {sorted(set(COLUMNS) - set(rows[0]))}")
    return [
        Served(
            r["client"],
            float(r["arrival_s"]),
            int(r["input_tokens"]),
            int(r["output_tokens"]),
            float(r["first_token_latency_s"]),
            float(r["request_latency_s"]),
            int(r.get(CACHED) or 0),
        )
        for r in rows
    ]


def write_requests(path: str | Path, served: Iterable[Served]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*COLUMNS, CACHED])
        for r in served:
            latencies = f"{r.first_token_latency_s:.6f}", f"{r.request_latency_s:.6f}"
            w.writerow(
                [
                    r.client,
                    f"{r.arrival_s:.6f}",
                    r.input_tokens,
                    r.output_tokens,
                    *latencies,
                    r.cached_tokens,
                ]
            )


def clients_of(served: Iterable[Served]) -> list[str]:
    return sorted({r.client for r in served})


# --- windows ---------------------------------------------------------------------------------


def service(
    served: list[Served], lo: float, hi: float, cost: Cost = linear_cost
) -> dict[str, float]:
    """Cost delivered to each client within [lo, hi], each request spread over its decode span."""
    out = dict.fromkeys(clients_of(served), 0.0)
    for r in served:
        start, end = r.start_s, r.end_s
        if start > hi or end < lo:
            continue  # PERF: outside the window, it adds 0 (a long run's plots ask 90 windows)
        if end > start:
            out[r.client] += cost(r) * max(0.0, min(end, hi) - max(start, lo)) / (end - start)
        elif lo <= start <= hi:  # a one-token request finishes at its first token
            out[r.client] += cost(r)
    return out


def demand(
    served: list[Served], lo: float, hi: float, cost: Cost = linear_cost
) -> dict[str, float]:
    """Cost of the requests each client sent within [lo, hi]."""
    out = dict.fromkeys(clients_of(served), 0.0)
    for r in served:
        if lo <= r.arrival_s <= hi:
            out[r.client] += cost(r)
    return out


def service_rates(
    served: list[Served],
    horizon: float,
    num_x: int = 30,
    cost: Cost = linear_cost,
    window: float = 60.0,
):
    """Per-client service rate (cost/s) in windows centred on ticks: ticks, {client: rates}.
    The paper's window is 60 s; a one-minute demo uses shorter ones."""
    ticks = [horizon * i / num_x for i in range(num_x + 1)]
    per_tick = [service(served, x - window / 2, x + window / 2, cost) for x in ticks]
    return ticks, {c: [w[c] / window for w in per_tick] for c in clients_of(served)}


def demand_rates(
    served: list[Served],
    horizon: float,
    num_x: int = 30,
    cost: Cost = linear_cost,
    window: float = 60.0,
):
    ticks = [horizon * i / num_x for i in range(num_x + 1)]
    per_tick = [demand(served, x - window / 2, x + window / 2, cost) for x in ticks]
    return ticks, {c: [w[c] / window for w in per_tick] for c in clients_of(served)}


def response_times(served: list[Served], horizon: float, num_x: int = 30):
    """Mean TTFT of the requests whose first token falls in each 60 s window (None if none)."""
    ticks = [horizon * i / num_x for i in range(num_x + 1)]
    out: dict[str, list[float | None]] = {}
    for c in clients_of(served):
        mine = [r for r in served if r.client == c]
        out[c] = []
        for x in ticks:
            ttfts = [r.first_token_latency_s for r in mine if x - 30 <= r.start_s <= x + 30]
            out[c].append(statistics.fmean(ttfts) if ttfts else None)
    return ticks, out


def accumulated_service_diff(
    served: list[Served],
    horizon: float | None = None,
    num_x: int = 20,
    skip_before: float = 1.0,
    cost: Cost = linear_cost,
) -> tuple[list[float], list[float]]:
    """max_j A_j(x) - min_j A_j(x), A_j(x) = client j's service over [0, x] (Fig. 3a, 7b, 8b)."""
    kept = [r for r in served if r.end_s >= skip_before]
    horizon = horizon if horizon is not None else float(int(max(r.arrival_s for r in served)))
    ticks = [horizon * i / num_x for i in range(1, num_x)]
    diffs = []
    for x in ticks:
        acc = service(kept, 0.0, x, cost)
        diffs.append(max(acc.values()) - min(acc.values()))
    return ticks, diffs


# --- the table -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableMetrics:
    max_diff: float
    avg_diff: float
    diff_var: float
    throughput: float  # input + output tokens per second, unweighted


def table_metrics(
    served: list[Served],
    total_time: float | None = None,
    horizon: float = 600.0,
    warmup: float = 30.0,
    num_x: int = 20,
    cost: Cost = linear_cost,
    demand_cost: Cost = linear_cost,
) -> TableMetrics:
    """Max/Avg/Var Diff and throughput as in the paper's Tables 2-6.

    At 19 ticks x_i = (horizon - warmup) * i / num_x, over the window [x_i, x_i + 60]: s_j and
    r_j are client j's service and demand rates, and the tick's difference is
    D = sum_j min(max_k s_k - s_j, |r_j - s_j|): each client's shortfall against the best served
    client, capped by how far it is from its own demand (asking for less is not unfairness).
    The "profile" tables (Tables 3-4) use h for s_j but the linear cost for r_j (`demand_cost`:
    a quirk of the artifact's script; lessons/artifact_deviations.md).

    An empty `served` is refused: a ValueError (no client, so no best-served one at the first
    tick), with or without `total_time`.
    """
    diffs = []
    for i in range(1, num_x):
        lo = (horizon - warmup) * i / num_x
        s = {c: v / 60 for c, v in service(served, lo, lo + 60, cost).items()}
        r = {c: v / 60 for c, v in demand(served, lo, lo + 60, demand_cost).items()}
        best = max(s.values())
        diffs.append(sum(min(best - s[c], abs(r[c] - s[c])) for c in s))
    if total_time is None:
        total_time = max(r.end_s for r in served) - min(r.arrival_s for r in served)
    tokens = sum(r.input_tokens + r.output_tokens for r in served)
    return TableMetrics(
        max(diffs), statistics.fmean(diffs), statistics.pvariance(diffs), tokens / total_time
    )


def mean_ttft(served: Iterable[Served]) -> dict[str, float]:
    """Each client's mean time to first token over its served requests."""
    ttft: dict[str, list[float]] = {}
    for r in served:
        ttft.setdefault(r.client, []).append(r.first_token_latency_s)
    return {c: statistics.fmean(v) for c, v in ttft.items()}


def jain_index(values: Iterable[float]) -> float:
    """(sum x)^2 / (n * sum x^2): 1 when all equal, 1/n when one client gets everything."""
    xs = list(values)
    squares = sum(x * x for x in xs)
    return sum(xs) ** 2 / (len(xs) * squares) if squares else 1.0
