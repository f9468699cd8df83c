"""Assignment a5: the paper's metric, Table 2's Max / Avg / Var Diff (Lessons 4 and 6).

Graded against the artifact's measured A10G runs: the paper's Table 2 rows for FCFS and VTC,
to two decimals, and properties any correct implementation has."""

from __future__ import annotations

import json

import pytest

from minivtc.sim import metrics
from minivtc.sim.metrics import Served
from minivtc.sim.workloads import A10G_RUNS

__all__ = ["run"]


def run(name: str) -> tuple[list[Served], float]:
    index = {r["run"]: r for r in json.loads((A10G_RUNS / "index.json").read_text())}
    return metrics.read_requests(A10G_RUNS / f"{name}.csv"), index[name]["total_time_s"]


@pytest.mark.parametrize(
    "name,expected",
    [
        ("FCFS__real", (759.97, 433.53, 32112.00, 777)),  # Table 2
        ("VTC__real", (368.40, 251.66, 6549.16, 779)),
    ],
    ids=["FCFS", "VTC"],
)
def test_table_2_rows(name, expected):
    """Table 2's FCFS and VTC rows, from the artifact's measured runs, to two decimals."""
    served, total = run(name)
    m = metrics.table_metrics(served, total)
    got = (round(m.max_diff, 2), round(m.avg_diff, 2), round(m.diff_var, 2))
    assert got == expected[:3], (
        f"{name}: (Max, Avg, Var Diff) = {got}, Table 2 says {expected[:3]} (Lesson 4: each "
        "tick's shortfall of each client against the best-served, capped by its own demand, "
        "over 60-second windows after the warm-up; the population variance)"
    )
    assert round(m.throughput) == expected[3], (
        f"{name}: throughput {m.throughput:.1f}, Table 2 says {expected[3]} tokens/s (prompt and "
        "output tokens over the total time)"
    )


def test_clients_served_alike_and_as_demanded_have_no_difference():
    """Two clients with identical requests side by side: each gets what it asks for, and
    the same as the other: every tick's difference is 0."""
    served = [Served(c, float(t), 10, 10, 1.0, 5.0) for t in range(600) for c in "ab"]
    m = metrics.table_metrics(served, 605.0)
    assert m.max_diff == pytest.approx(0.0, abs=1e-9) and m.diff_var == pytest.approx(0.0), (
        f"two clients served identically, each as it asked: Max Diff {m.max_diff}, Var "
        f"{m.diff_var}, not 0 (a difference compares each client with the best-served)"
    )
    assert m.throughput == pytest.approx(2 * 600 * 20 / 605.0), (
        f"1,200 requests of 20 tokens over a total time of 605 s: throughput {m.throughput}, not "
        f"{2 * 600 * 20 / 605.0:.3f} (prompt and output tokens over the total time)"
    )


def test_without_a_total_time_throughput_is_over_the_served_span():
    """Without total_time, throughput is over the span from the first arrival to the last end."""
    served = [Served(c, 10.0 + t, 10, 10, 1.0, 5.0) for t in range(600) for c in "ab"]
    m = metrics.table_metrics(served)
    span = (609.0 + 5.0) - 10.0
    assert m.throughput == pytest.approx(2 * 600 * 20 / span), (
        f"throughput {m.throughput:.3f}, not {2 * 600 * 20 / span:.3f} tokens/s: without "
        "total_time it is the last end minus the first arrival"
    )


@pytest.mark.parametrize("cost", ["linear", "profiled"])
def test_a_starved_client_counts_up_to_its_demand(cost):
    """A starved client's shortfall is capped by its own demand (priced with the linear cost).
    b is served nothing while asking for less than a's service."""
    a = [Served("a", float(t), 10, 20, 1.0, 2.0) for t in range(600)]  # 50 a second
    b = [Served("b", float(t), 10, 5, 1000.0, 1001.0) for t in range(0, 600, 2)]  # 10 a second
    h = {"linear": metrics.linear_cost, "profiled": metrics.profiled_cost}[cost]
    m = metrics.table_metrics(a + b, 1601.0, cost=h)  # the demand is priced linearly either way
    expected = min(h(a[0]), 10.0)  # a's rate (one request a second), or b's demand (10/s)
    assert m.max_diff == pytest.approx(expected, rel=0.05), (
        f"Max Diff {m.max_diff:.2f}, not {expected:.2f}: b's shortfall against a, capped by b's "
        "demand (priced with the linear cost, as the artifact's script does)"
    )
