"""The paper's workloads: every generator of its experiments, seeded, and the real 27-client trace.

Owns: `TraceRequest` (client, arrival time, input and output lengths), the trace CSV format
(`client,arrival_s,input_tokens,output_tokens`), the generators of the experiments of Sections
5.2-5.4 and Appendix B with their rates, lengths and durations, and `WORKLOADS`, the named
suites. Does not own: running a trace (`simulator.py` for virtual time, the load generator for a
real server). Lessons 4-8 use it.

Generators follow the artifact's `fair_bench/trace.py`; Python's `random` stands in for
NumPy's, so individual draws differ from the artifact's while the processes are the same.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["A10G_RUNS", "DATA_DIR", "REAL_TRACE", "TraceRequest", "WORKLOADS", "client_name"]
__all__ += ["poisson", "read_trace", "uniform", "workload", "write_trace"]

DATA_DIR = Path(__file__).resolve().parents[1] / "data"  # minivtc/data: the paper's data
A10G_RUNS = DATA_DIR / "a10g_runs"  # the artifact's measured A10G runs
REAL_TRACE = DATA_DIR / "lmsys_arena_27clients_10min.csv"
SEED = 42  # every artifact generator seeds 42 first


@dataclass(frozen=True)
class TraceRequest:
    client: str
    arrival_s: float
    input_tokens: int
    output_tokens: int  # where it ends (at EOS, or at max_tokens)
    max_tokens: int | None = None  # the request's limit, if it asked for more than it got
    # Requests with the same prefix_id share their first prefix_tokens prompt tokens (a system
    # prompt, a conversation so far): what a prefix cache can reuse.
    prefix_id: str | None = None
    prefix_tokens: int = 0


def client_name(i: int) -> str:
    return f"client-{i:02d}"


def read_trace(path: str | Path) -> list[TraceRequest]:
    """A trace CSV, sorted by arrival; a bad row is a ValueError naming the file and line."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"client", "arrival_s", "input_tokens", "output_tokens"} - set(
            reader.fieldnames or []
        )
        if missing:
            raise ValueError(f"{path}: missing columns {sorted(missing)}")
        trace = []
        for row in reader:
            try:
                trace.append(trace_request(row))
            except (ValueError, TypeError) as e:
                raise ValueError(f"{path}, line {reader.line_num}: {e}") from None
    return sorted(trace, key=lambda r: r.arrival_s)


def trace_request(row: dict[str, str]) -> TraceRequest:
    """One row; `max_tokens`, `prefix_id` and `prefix_tokens` are optional (columns that may
    be absent or empty)."""
    arrival = float(row["arrival_s"])
    n_in, n_out = int(row["input_tokens"]), int(row["output_tokens"])
    limit = int(row["max_tokens"]) if row.get("max_tokens") else None
    prefix_id = row.get("prefix_id") or None
    prefix = int(row["prefix_tokens"]) if prefix_id and row.get("prefix_tokens") else 0
    if not math.isfinite(arrival) or n_in < 1 or n_out < 1:
        raise ValueError(f"want a finite arrival_s and token counts >= 1, got {row}")
    if limit is not None and limit < n_out:
        raise ValueError(f"max_tokens {limit} < output_tokens {n_out}: it could not end there")
    if not 0 <= prefix <= n_in:
        raise ValueError(f"prefix_tokens {prefix} is not within input_tokens {n_in}")
    return TraceRequest(row["client"], arrival, n_in, n_out, limit, prefix_id, prefix)


def write_trace(path: str | Path, trace: list[TraceRequest]) -> None:
    """The trace CSV; the max_tokens and prefix columns only when a request uses them."""
    limits = any(r.max_tokens is not None for r in trace)
    prefixes = any(r.prefix_id is not None for r in trace)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            ["client", "arrival_s", "input_tokens", "output_tokens"]
            + (["max_tokens"] if limits else [])
            + (["prefix_id", "prefix_tokens"] if prefixes else [])
        )
        for r in trace:
            row = [r.client, f"{r.arrival_s:.6f}", r.input_tokens, r.output_tokens]
            row += [r.max_tokens or ""] if limits else []
            row += [r.prefix_id or "", r.prefix_tokens if r.prefix_id else ""] if prefixes else []
            w.writerow(row)


# --- the generators --------------------------------------------------------------------------


def uniform(
    rates: list[float],
    duration: float,
    lengths: tuple[int, int] = (256, 256),
    on_off: float | None = None,
    seed: int = SEED,
) -> list[TraceRequest]:
    """Evenly spaced arrivals per client (the artifact's "uniform"); with `on_off`, client 0 is
    ON for `on_off` seconds, OFF for the next `on_off`, and so on (its OFF arrivals dropped)."""
    rng = random.Random(seed)
    trace = []
    for i, rate in enumerate(rates):
        first = rng.random() / rate + 1 / rate
        for k in range(int(rate * duration)):
            t = first + k / rate
            if i == 0 and on_off and int(t // on_off) % 2 == 1:
                continue
            trace.append(TraceRequest(client_name(i), t, *lengths))
    return sorted(trace, key=lambda r: r.arrival_s)


def poisson(
    rates: list[float], duration: float, lengths: list[tuple[int, int]], seed: int = SEED
) -> list[TraceRequest]:
    """One merged Poisson process of rate sum(rates); each arrival goes to client i with
    probability rates[i] / sum(rates) and takes that client's (input, output) lengths."""
    rng = random.Random(seed)
    total = sum(rates)
    trace, t = [], 0.0
    for _ in range(int(total * duration)):
        t += rng.expovariate(total)
        i = rng.choices(range(len(rates)), weights=rates)[0]
        trace.append(TraceRequest(client_name(i), t, *lengths[i]))
    return trace


def increase(
    rate0: float, rate1_end: float, duration: float, lengths=(256, 256)
) -> list[TraceRequest]:
    """Client 0 steady at rate0; client 1's rate ramps linearly from 0.2 req/s to rate1_end."""
    trace = [
        TraceRequest(client_name(0), (k + 1) / rate0, *lengths)
        for k in range(int(rate0 * duration))
    ]
    t = 0.0
    for _ in range(int(0.5 * (0.2 + rate1_end) * duration)):
        rate = 0.2 + (rate1_end - 0.2) * min(t / duration, 1.0)
        t += 1 / rate
        trace.append(TraceRequest(client_name(1), t, *lengths))
    return sorted(trace, key=lambda r: r.arrival_s)


def dist_shift(seed: int = SEED) -> list[TraceRequest]:
    """900 s in three 300 s phases: [0.5 ON/OFF, 2], then [1, 1], then [0.5, 1.5] req/s."""
    phases = [([0.5, 2.0], 60.0), ([1.0, 1.0], None), ([0.5, 1.5], None)]
    trace = []
    for p, (rates, on_off) in enumerate(phases):
        for r in uniform(rates, 300.0, on_off=on_off, seed=seed + p):
            trace.append(
                TraceRequest(r.client, r.arrival_s + 300.0 * p, r.input_tokens, r.output_tokens)
            )
    return sorted(trace, key=lambda r: r.arrival_s)


def real() -> list[TraceRequest]:
    """The paper's real trace: 1500 LMSYS Chatbot Arena requests, 27 clients, 600 s (Table 2)."""
    return read_trace(REAL_TRACE)


# --- the named suites (Sections 5.2-5.4, Appendix B) ------------------------------------------


@dataclass(frozen=True)
class Workload:
    name: str
    make: Callable[[], list[TraceRequest]]
    duration: float  # the horizon the paper's plots use
    description: str
    weights: dict[str, float] | None = None  # operator weights the paper ran WVTC with


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload(
            "overload",
            lambda: uniform([1.5, 3.0], 360),
            360,
            "2 clients at 90 and 180 rpm, 256/256: both above their fair share (Fig. 3)",
        ),
        Workload(
            "overload-multi",
            lambda: uniform([0.4] * 3 + [0.6] * 5, 360),
            360,
            "8 clients: 3 at 24 rpm, 5 at 36 rpm, 256/256 (Table 6)",
        ),
        Workload(
            "overload-weighted",
            lambda: uniform([0.8, 0.8, 1.2, 1.6], 360),
            360,
            "4 clients at 48/48/72/96 rpm, weights 1:2:3:4 (Fig. 16)",
            weights={client_name(i): float(i + 1) for i in range(4)},
        ),
        Workload(
            "proportional",
            lambda: uniform([0.25, 0.5, 1.5], 600),
            600,
            "3 clients at 15/30/90 rpm: two under their share, one over (Fig. 4)",
        ),
        Workload(
            "on_off_less",
            lambda: uniform([0.5, 2.0], 600, on_off=60),
            600,
            "client 0 at 30 rpm ON/OFF every 60 s, client 1 at 120 rpm (Fig. 5)",
        ),
        Workload(
            "on_off_overload",
            lambda: uniform([2.0, 3.0], 600, on_off=60),
            600,
            "client 0 at 120 rpm ON/OFF every 60 s, client 1 at 180 rpm (Fig. 6)",
        ),
        Workload(
            "poisson_short_long",
            lambda: poisson([8.0, 1.5], 600, [(64, 64), (256, 256)]),
            600,
            "Poisson: 480 rpm of 64/64 and 90 rpm of 256/256 (Fig. 7)",
        ),
        Workload(
            "poisson_short_long_2",
            lambda: poisson([8.0, 1.5], 600, [(512, 32), (32, 512)]),
            600,
            "Poisson: 480 rpm of 512-in/32-out and 90 rpm of 32-in/512-out (Fig. 8)",
        ),
        Workload(
            "increase",
            lambda: increase(0.5, 2.0, 600),
            600,
            "client 0 at 30 rpm; client 1 ramps from 12 to 120 rpm (Fig. 9)",
        ),
        Workload(
            "dist_shift", dist_shift, 900, "15 min in three phases of demand (Fig. 10: VTC vs LCF)"
        ),
        Workload("real", real, 600, "the LMSYS Arena trace: 27 clients, 1500 requests (Table 2)"),
    ]
}


def workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of: {', '.join(WORKLOADS)}")
    return WORKLOADS[name]
