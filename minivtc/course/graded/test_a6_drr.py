"""Assignment a6 (capstone): a fair policy of your own, plugged into the engine: Deficit Round
Robin as the paper's Appendix C.2 adapts it (`minivtc/core/drr.py` says what it must do).

Graded on its stated bound, two clients backlogged over an interval receive service within
2(U + Q), on random workloads through the real engine loop, and on the paper's workloads in
the simulator, side by side with VTC and FCFS."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from minivtc.core.drr import DRR
from minivtc.course.graded.harness import (
    Arrival,
    bound_u,
    drive,
    max_gap,
    random_arrivals,
    workloads,
)
from minivtc.harness import metrics
from minivtc.harness.sim import simulate
from minivtc.harness.workloads import workload


@pytest.mark.parametrize("quantum", [1.0, 32.0, 256.0])
@settings(max_examples=25, deadline=None)
@given(w=workloads)
def test_the_service_gap_stays_within_2_u_plus_q(quantum, w):
    arrivals = random_arrivals(w)
    u = bound_u(max(a.prompt for a in arrivals), w["kv_tokens"])
    _, steps, _ = drive(DRR(quantum), arrivals, w["kv_tokens"])  # (every request is served)
    clients = sorted({a.client for a in arrivals})
    for f in clients:
        for g in clients:
            if f < g:
                assert max_gap(steps, f, g) <= 2 * (u + quantum), (f, g)


def test_backlogged_clients_share_equally_whatever_their_request_sizes():
    """Three clients always backlogged, with small, medium and large requests: each gets
    about a third of the service (FCFS would give the large one most)."""
    sizes = {"s": (4, 4), "m": (8, 16), "l": (16, 40)}
    arrivals = [Arrival(0.0, c, *sizes[c]) for c in sizes for _ in range(120)]
    _, steps, _ = drive(DRR(16.0), arrivals, kv_tokens=120)
    busy = [s for s in steps if s.backlogged == set(sizes)]
    total = {c: sum(s.service.get(c, 0.0) for s in busy) for c in sizes}
    mean = sum(total.values()) / 3
    assert all(abs(v - mean) <= 0.15 * mean for v in total.values()), total


@pytest.mark.parametrize("name", ["overload", "on_off_overload", "real"])
def test_on_the_papers_workloads_as_fair_as_vtc_and_as_fast(name):
    w = workload(name)
    trace = w.make()
    table = {}
    for policy in ("fcfs", "vtc", DRR()):
        r = simulate(trace, policy)
        table[getattr(policy, "name", policy)] = metrics.table_metrics(
            r.served, r.total_time, horizon=w.duration
        )
    drr, vtc, fcfs = table["drr:256"], table["vtc"], table["fcfs"]
    assert drr.max_diff <= 1.1 * vtc.max_diff and drr.avg_diff <= 1.1 * vtc.avg_diff
    assert drr.avg_diff < 0.7 * fcfs.avg_diff
    assert drr.throughput >= 0.98 * vtc.throughput
