"""`minivtc bench route`: what one decision of the fair dispatcher costs at fleet scale.

Owns the measurement: 64 backends, every one full, and n clients (10 to 100,000) each with
requests waiting at the dispatcher. One decision: a request finishes on a backend
(`on_finish`: its room freed) and the admission round binds the next one (`bind`: peek the
smallest counter, scan the backends for room, route, reserve, dispatch, charge the prompt), and
the dispatched client sends a new request so that everyone stays waiting. Microseconds per
decision: a warm-up round, then rounds of decisions, each round's mean; printed as the median
round with the fastest and the slowest (this VM's speed drifts between rounds). (The gateway's
HTTP overhead against direct requests is `bench_gateway.py`'s.)
"""

from __future__ import annotations

import statistics
import time

from minivtc.fairness.vtc import VTC
from minivtc.fleet.backend import Backend
from minivtc.fleet.dispatcher import Dispatcher
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request
from minivtc.sim.simulator import gc_paused

__all__ = ["bench_route", "time_decisions"]

NUM_BACKENDS = 64
PER_BACKEND = 4  # requests of 16 tokens each backend holds


def bench_route(quick: bool, rounds: int = 5) -> int:
    sizes = [10, 1000] if quick else [10, 1000, 10_000, 100_000]
    decisions = 200 if quick else 2000
    print(
        f"microseconds per dispatcher decision, {NUM_BACKENDS} backends, all full: median "
        f"[min, max] of {rounds} rounds of {decisions} decisions, after a warm-up round"
    )
    print(f"{'clients':>8} {'decision':>10}  range")
    with gc_paused():  # a collection over 200k live requests is not the dispatcher's cost
        for n in sizes:
            times = time_decisions(n, decisions, rounds)
            print(f"{n:>8} {statistics.median(times):>10.2f}  [{min(times):.2f}, {max(times):.2f}]")
    return 0


def time_decisions(n_clients: int, decisions: int, rounds: int) -> list[float]:
    """Each round's mean microseconds per decision (the first, a warm-up, left out)."""
    vtc = VTC()
    backends = [Backend(f"b{k}", 16 * PER_BACKEND) for k in range(NUM_BACKENDS)]
    dispatcher = Dispatcher(vtc, backends)
    per_client = 2 + NUM_BACKENDS * PER_BACKEND // n_clients  # still waiting once it fills
    for i in range(n_clients):
        for j in range(per_client):
            dispatcher.add(request(f"{i}-{j}", f"client-{i}"), 0.0)
    running = [r for r, _ in dispatcher.bind()]  # the fleet fills
    assert len(running) == NUM_BACKENDS * PER_BACKEND
    times = []
    for round_ in range(rounds + 1):
        refills = [request(f"new-{round_}-{k}", "") for k in range(decisions)]
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


def request(request_id: str, client: str) -> Request:
    return Request(request_id, client, [1] * 8, SamplingParams(max_tokens=8), 0.0)
