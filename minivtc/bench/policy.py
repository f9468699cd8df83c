"""`minivtc bench scheduler` (VTC's heap against the artifact's linear scan), `minivtc bench
route` (one decision of the fleet's dispatcher) and `minivtc bench sim` (the simulator's speed on
the paper's workloads, or on a million requests): the policy layer's benchmarks, plain Python.
`suite.py`'s docstring says what each prints; the scheduler's and the simulator's take turns
round by round (`timing.py`). (The gateway's HTTP overhead against direct requests, `bench route
--gateway`, is `gateway_overhead.py`'s.)
"""

from __future__ import annotations

import functools
import random
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from minivtc.bench.timing import interleaved, ratios, spread
from minivtc.fairness.least_counter import LinearScan
from minivtc.fairness.vtc import VTC
from minivtc.fleet.backend import Backend
from minivtc.fleet.dispatcher import Dispatcher
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request

__all__ = ["ScanVTC", "bench_route", "bench_scheduler", "bench_sim", "time_dispatcher_decisions"]

if TYPE_CHECKING:
    from minivtc.sim.simulator import SimResult


# --- scheduler: heap vs linear scan ----------------------------------------------------------


class ScanVTC(VTC):
    """VTC with the official artifact's selection: scan every client for the smallest counter."""

    Least = LinearScan


def bench_scheduler(quick: bool, rounds: int) -> int:
    from minivtc.sim.simulator import gc_paused

    sizes = [10, 1000] if quick else [10, 1000, 10_000, 100_000]
    print(
        f"microseconds per operation, VTC with every client waiting (each a mean over a run; "
        f"medians of {rounds} interleaved rounds after a warm-up round; the ratio's [min, max] "
        f"by wall time and by process CPU time)"
    )
    print(
        f"{'clients':>8} {'decide heap':>12} {'decide scan':>12} {'scan / heap':>20} "
        f"{'(CPU time)':>20} {'charge heap':>12} {'charge scan':>12}"
    )
    # As timeit does: a collection over 200k live requests is not the scheduler's cost.
    with gc_paused():
        for n in sizes:
            decide: dict[str, list[tuple[float, float]]] = {"heap": [], "scan": []}
            charge: dict[str, list[float]] = {"heap": [], "scan": []}
            for k in range(-1, rounds):  # heap and scan take turns, who goes first alternating
                for name, cls in (("heap", VTC), ("scan", ScanVTC))[:: 1 - 2 * (k % 2)]:
                    decision = time_scheduler_decisions(cls(), n, quick)
                    token = time_charges(cls(), n)
                    if k >= 0:  # round -1 warms up
                        decide[name].append(decision)
                        charge[name].append(token)
            med = {name: statistics.median(w for w, _ in v) for name, v in decide.items()}
            wall, cpu = (ratios(decide["scan"], decide["heap"], clock) for clock in (0, 1))
            print(
                f"{n:>8} {med['heap']:>12.2f} {med['scan']:>12.2f} {spread(wall, '{:.0f}x'):>20} "
                f"{spread(cpu, '{:.0f}x'):>20} {statistics.median(charge['heap']):>12.2f} "
                f"{statistics.median(charge['scan']):>12.2f}"
            )
    return 0


def populate(vtc: VTC, n_clients: int) -> list[Request]:
    """n clients, each with two waiting requests and a distinct counter."""
    lift, vtc.lift = vtc.lift, False  # the scan variant's lift is O(n) per arrival: n^2 setup
    requests = []
    for i in range(n_clients):
        for j in range(2):
            r = Request(f"{i}-{j}", f"client-{i}", [1] * 8, SamplingParams(max_tokens=8), 0.0)
            vtc.add(r, 0.0)
            requests.append(r)
        vtc.counters[f"client-{i}"] = float((i * 7919) % n_clients)
        vtc.least.push(f"client-{i}")
    vtc.least.compact()  # the pushes above left a stale entry per client
    vtc.lift = lift
    return requests


def time_scheduler_decisions(vtc: VTC, n_clients: int, quick: bool) -> tuple[float, float]:
    """One decision = peek at the minimum, dispatch it (charge its prompt), refill its queue.
    Microseconds per decision: (wall, process CPU)."""
    populate(vtc, n_clients)
    rounds = 200 if n_clients >= 10_000 and not quick else 2000
    refills = [Request(f"new-{k}", "", [1] * 8, SamplingParams(), 0.0) for k in range(rounds)]
    start, cpu = time.perf_counter(), time.process_time()
    for refill in refills:
        request = vtc.peek()
        assert request is not None
        vtc.dispatch(request)
        refill.client_id = request.client_id  # keep every client waiting
        vtc.add(refill, 0.0)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return 1e6 * wall / rounds, 1e6 * cpu / rounds


def time_charges(vtc: VTC, n_clients: int) -> float:
    """One output token charged to a running request of a client that also has requests waiting."""
    requests = populate(vtc, n_clients)
    for r in requests:  # as if dispatched: a token's charge starts from what dispatch charged
        vtc.charged[r.request_id] = (0.0, vtc.cost(r.num_prompt, 0))
    rounds = 20_000
    start = time.perf_counter()
    for k in range(rounds):
        r = requests[(k * 104729) % len(requests)]
        r.output_ids.append(1)
        vtc.on_decode([r])
    return 1e6 * (time.perf_counter() - start) / rounds


# --- dispatcher: one decision at fleet scale ------------------------------------------------
# 64 backends, every one full, and n clients (10 to 100,000) each with requests waiting at the
# dispatcher. One decision: a request finishes on a backend (`on_finish`: its room freed) and the
# admission round binds the next one (`bind`: peek the smallest counter, scan the backends for
# room, route, reserve, dispatch, charge the prompt), and the dispatched client sends a new
# request so that everyone stays waiting. Microseconds per decision: a warm-up round, then rounds
# of decisions, each round's mean; printed as the median round with the fastest and the slowest
# (this VM's speed drifts between rounds).

NUM_BACKENDS = 64
PER_BACKEND = 4  # requests of 16 tokens each backend holds


def bench_route(quick: bool, rounds: int = 5) -> int:
    from minivtc.sim.simulator import gc_paused

    sizes = [10, 1000] if quick else [10, 1000, 10_000, 100_000]
    decisions = 200 if quick else 2000
    print(
        f"microseconds per dispatcher decision, {NUM_BACKENDS} backends, all full: median "
        f"[min, max] of {rounds} rounds of {decisions} decisions, after a warm-up round"
    )
    print(f"{'clients':>8} {'decision':>10}  range")
    with gc_paused():  # a collection over 200k live requests is not the dispatcher's cost
        for n in sizes:
            times = time_dispatcher_decisions(n, decisions, rounds)
            print(f"{n:>8} {statistics.median(times):>10.2f}  [{min(times):.2f}, {max(times):.2f}]")
    return 0


def time_dispatcher_decisions(n_clients: int, decisions: int, rounds: int) -> list[float]:
    """Each round's mean microseconds per decision (the first, a warm-up, left out)."""
    vtc = VTC()
    backends = [Backend(f"b{k}", 16 * PER_BACKEND) for k in range(NUM_BACKENDS)]
    dispatcher = Dispatcher(vtc, backends)
    per_client = 2 + NUM_BACKENDS * PER_BACKEND // n_clients  # still waiting once it fills
    for i in range(n_clients):
        for j in range(per_client):
            dispatcher.add(small_request(f"{i}-{j}", f"client-{i}"), 0.0)
    running = [r for r, _ in dispatcher.bind()]  # the fleet fills
    assert len(running) == NUM_BACKENDS * PER_BACKEND
    times = []
    for round_ in range(rounds + 1):
        refills = [small_request(f"new-{round_}-{k}", "") for k in range(decisions)]
        start = time.perf_counter()
        for k, refill in enumerate(refills):
            done = running[k % len(running)]
            dispatcher.on_finish(done)
            ((new, _),) = dispatcher.bind()
            running[k % len(running)] = new
            refill.client_id = new.client_id  # it keeps waiting
            dispatcher.add(refill, 0.0)
        times.append(1e6 * (time.perf_counter() - start) / decisions)
    return times[1:]


def small_request(request_id: str, client: str) -> Request:
    return Request(request_id, client, [1] * 8, SamplingParams(max_tokens=8), 0.0)


# --- simulator speed -------------------------------------------------------------------------


def million_trace(n: int = 1_000_000, clients: int = 1000, rate: float = 200.0, seed: int = 0):
    """n requests of 64 prompt / 16 output tokens from `clients` clients, Poisson at `rate`
    per second: about 4x what the a10g-llama7b model serves (~52 requests/s), so the waiting
    queue grows to hundreds of thousands and every admission meets a full pool."""
    from minivtc.sim.workloads import TraceRequest

    rng = random.Random(seed)
    trace, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(rate)
        trace.append(TraceRequest(f"c{rng.randrange(clients):04d}", t, 64, 16))
    return trace


def bench_sim(quick: bool, million: bool = False, repeat: int = 5) -> int:
    """Each case `repeat` times, the schedulers taking turns (`interleaved`: a VM's speed
    drifts from minute to minute, and turns give both the same spells) after a warm-up round
    (not with --million: each run is a minute); rates use the median wall time, and the VTC /
    FCFS ratio is taken round by round, by wall time and by process CPU time."""
    from minivtc.sim.workloads import workload

    names = ["1M"] if million else ["overload"] if quick else ["real", "overload"]
    print(
        f"{'workload':>10} {'scheduler':>9} {'requests':>8} {'tokens':>9} {'steps':>7} "
        f"{'min s':>7} {'median s':>8} {'CPU s':>7} {'sim s':>7} {'sim s/wall s':>12} "
        f"{'us/token':>9}"
    )
    ratio_lines = []
    for name in names:
        trace = million_trace() if name == "1M" else workload(name).make()
        if quick:
            trace = [t for t in trace if t.arrival_s < 30]
        tokens = sum(t.output_tokens for t in trace)
        results: dict[str, SimResult] = {}  # every run simulates the same steps: keep one
        runs: dict[str, Callable[[], object]] = {  # (--million: minutes a run, with progress)
            p: functools.partial(simulate_into, results, trace, p, million) for p in ("vtc", "fcfs")
        }
        times = interleaved(runs, repeat, warmup=not million)
        for policy, t in times.items():
            r, walls = results[policy], [w for w, _ in t]
            wall, cpu = statistics.median(walls), statistics.median(c for _, c in t)
            print(
                f"{name:>10} {policy:>9} {len(trace):>8} {tokens:>9} {r.steps:>7} "
                f"{min(walls):>7.2f} {wall:>8.2f} {cpu:>7.2f} {r.total_time:>7.0f} "
                f"{r.total_time / wall:>12.0f} {1e6 * wall / tokens:>9.1f}"
            )
        wall_ratio, cpu_ratio = (ratios(times["vtc"], times["fcfs"], c) for c in (0, 1))
        ratio_lines.append(
            f"{name}: VTC / FCFS {spread(wall_ratio)} by wall time, "
            f"{spread(cpu_ratio)} by CPU time, over {repeat} rounds"
        )
    print("\n".join(ratio_lines))
    return 0


def simulate_into(results: dict[str, SimResult], trace, policy: str, progress: bool) -> None:
    from minivtc.sim.simulator import simulate

    results[policy] = simulate(trace, policy, progress=progress)
