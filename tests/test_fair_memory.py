"""minivtc/experiments/fair_memory.py's pieces that Lesson 11 spells out: the sweep's run against
`simulate` on the same configuration, and the report's table read back."""

from __future__ import annotations

from minivtc.experiments.fair_memory import (
    POOL,
    full_speed,
    gap_run,
    long_trace,
    number,
    table_rows,
)
from minivtc.sim import metrics
from minivtc.sim.simulator import simulate

TRACE = long_trace()[:150]  # the first requests: seconds, not a minute


def test_a_gap_run_measures_what_simulate_does_on_the_same_configuration():
    run = gap_run(TRACE, 500.0)
    sim = simulate(
        TRACE,
        "vtc",
        "a10g-llama7b",
        POOL,
        reservation="none",
        victim="fair",
        preempt_gap=500.0,
        check_fairness=True,
        watch_backlog=True,
    )
    assert (run.gap, run.bound, run.preemptions) == (sim.backlogged_gap, sim.bound, sim.preemptions)
    assert run.gap <= run.bound == run.check.gap_bound()
    assert run.throughput == metrics.table_metrics(sim.served, sim.total_time).throughput


def test_full_speed_is_full_reservation_s_tokens_per_second():
    sim = simulate(TRACE, "vtc", "a10g-llama7b", POOL, reservation="full")
    assert full_speed(TRACE) == metrics.table_metrics(sim.served, sim.total_time).throughput


def test_the_table_is_read_back_by_victim_or_reservation():
    lines = [
        "| reservation | victim (gap) | tokens/s | Max / Avg / Var Diff | gap | bound | "
        "preemptions | recomputed (swapped) tokens |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        "| full | - | 1234 | 1.0 / 0.5 / 3 | 9,876 | 40,000 | 0 | 0 (0% of served) |",
        "| none | fair (1000) | 2345 | 1.0 / 0.5 / 3 | 800 | 2,100 | 17 | 5,000 (61% of served) |",
        "| none | latest | 2300 | 1.0 / 0.5 / 3 | 30,000 | none stated | 9 | 10 (1% of served) |",
        "### Theorem 4.8's construction, M = 100",
        "| full | - | 200 | 400 | 0 |",
    ]
    rows = table_rows(lines)
    assert set(rows) == {"full", "fair (1000)", "latest"}
    assert (rows["full"].speed, rows["full"].gap, rows["full"].bound) == (1234, 9876, 40000)
    assert rows["fair (1000)"].recomputed == 5000 and rows["fair (1000)"].share == 0.61
    assert rows["latest"].bound is None and number("0 (750,836) x") == 0.0
