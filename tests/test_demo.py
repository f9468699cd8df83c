"""`minivtc demo`'s recipe, without running it: the workload, the limits and the verdict scale
with the capacity measured, so the demo shows the same thing on any machine."""

from __future__ import annotations

from collections import Counter

import pytest

from minivtc.serving import demo
from minivtc.serving.loadgen import ReplayResult
from minivtc.sim.metrics import Served


@pytest.mark.parametrize("duration", [60.0, 120.0])
@pytest.mark.parametrize("capacity", [0.5, 3.0, 10.0, 40.0, 200.0])
def test_the_limits_scale_with_the_machine_so_the_demo_meets_neither(capacity, duration):
    """Even on a machine that serves 20% less during the runs than when the demo measured it
    (the light client then still gets all it sends; the heavy client the rest): the heavy
    client's backlog stays within a client's share, and every request of the trace open at
    once stays under the connection cap."""
    plan = demo.plan_for(capacity, duration)
    limits = plan.server.limits
    served = 0.8 * capacity
    heavy_backlog = (plan.heavy_rate - (served - plan.light_rate)) * duration + demo.BATCH
    assert heavy_backlog <= limits.max_client_requests
    everything_open = (plan.heavy_rate + plan.light_rate - served) * duration + demo.BATCH
    assert everything_open < limits.max_connections / 2
    assert limits.max_client_requests >= 2 * demo.BATCH


def served(client: str, arrival: float, ttft: float, span: float = 4.0) -> Served:
    return Served(client, arrival, demo.INPUT_TOKENS, demo.OUTPUT_TOKENS, ttft, ttft + span)


def test_the_verdict_is_computed_from_the_run():
    plan = demo.plan_for(2.0, 10.0)
    light = [t for t in plan.trace if t.client == "light"]
    heavy = [t for t in plan.trace if t.client == "heavy"]
    at_once = ReplayResult(
        [served("light", t.arrival_s, 0.2) for t in light]
        + [served("heavy", t.arrival_s, 3.0) for t in heavy[:8]],
        failed_by_client=Counter(heavy=len(heavy) - 8),
    )
    late = ReplayResult([served("light", t.arrival_s, 2.5) for t in light])
    lost = ReplayResult([served("light", t.arrival_s, 0.1) for t in light[1:]])
    lines = demo.verdicts({"vtc": at_once, "fcfs": late, "rr": lost}, plan)
    assert lines[0].startswith("VTC: light received all it asked for (mean TTFT 0.20 s)")
    assert lines[0].endswith(
        f"({len(heavy) - 8} of its requests refused): heavy absorbed the overload."
    )
    assert "refused" not in lines[1]
    assert lines[1].startswith(
        f"FCFS: light's {len(light)} requests all finished, but it waited 2.50 s"
    )
    assert lines[2].startswith(f"RR: light lost 1 of its {len(light)} requests")


def test_throughput_counts_the_tokens_delivered_while_overloaded_not_the_drain():
    """Requests spread over [WARM_UP_S, duration] count whole; one that ran after the arrivals
    ended (in the drain) counts nothing."""
    plan = demo.plan_for(2.0, 25.0)
    inside = [served("heavy", 6.0 + k, 0.0, span=1.0) for k in range(10)]
    after = [served("heavy", 30.0, 0.0, span=1.0)]
    rate = demo.throughput(ReplayResult(inside + after), plan)
    expected = 10 * (demo.INPUT_TOKENS + demo.OUTPUT_TOKENS) / (25.0 - demo.WARM_UP_S)
    assert rate == pytest.approx(expected)
