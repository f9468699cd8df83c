"""`reproduce --only replicas` (`experiments/across_replicas.py`): its verdicts read its own
rows. (The runs themselves are `test_fleet_replicas.py`'s at four replicas; this section's
take minutes.)"""

from __future__ import annotations

from minivtc.experiments.across_replicas import Row, run_row, table, verdicts


def row(label: str, first: float, second: float, gap: float, bound: float | None) -> Row:
    return Row(8, "weighted", label, first, second, gap, bound, [], {}, 0.0)


def test_the_verdicts_say_yes_only_when_the_runs_show_it():
    bounds = {(8, "weighted"): 100.0}
    fair = [row("global, prefix", 80, 20, 50, 100), row("prefix", 10, 90, 500, None)]
    text = "\n".join(verdicts(fair, bounds))
    assert "gap within 2U: yes" in text and "breaks 2U: yes" in text
    unfair = [row("global, prefix", 50, 50, 50, 100), row("prefix", 10, 90, 50, None)]
    text = "\n".join(verdicts(unfair, bounds))
    assert "gap within 2U: NO" in text and "breaks 2U: NO" in text


def test_the_table_gives_each_row_its_ratio_and_the_2u_of_its_fleet():
    rows = [row("global, prefix", 80, 20, 50, 100), row("prefix", 10, 90, 500, None)]
    lines = table(rows, {(8, "weighted"): 1234.0})
    assert lines[2] == "| 8 | weighted | global, prefix | 80 : 20 | 4.00 (4) | 50 | 1,234 |"
    assert lines[3] == "| 8 | weighted | prefix | 10 : 90 | 0.11 (4) | 500 | 1,234 |"


def test_a_run_row_names_its_route_only_for_the_dispatcher_and_counts_where_tenants_ran():
    """One replica: both tenants on replica 0; the dispatcher's row states its bound."""
    alone, fair = run_row(1, "weighted", "round-robin", "prefix"), run_row(1, "weighted", "global")
    assert (alone.label, alone.bound) == ("round-robin", None) and fair.label == "global"
    assert alone.seen == fair.seen == {0: ["free", "gold"]}
    assert fair.bound is not None and fair.gap <= fair.bound and fair.throughput > 0
