"""`reproduce --only replicas` (`fleet/experiment.py`): its verdicts read its own rows. (The
runs themselves are `test_fleet_replicas.py`'s at four replicas; this section's take minutes.)"""

from __future__ import annotations

from minivtc.fleet.experiment import Row, verdicts


def row(label: str, first: float, second: float, gap: float, bound: float | None) -> Row:
    return Row(8, "weighted", label, first, second, gap, bound, [])


def test_the_verdicts_say_yes_only_when_the_runs_show_it():
    bounds = {(8, "weighted"): 100.0}
    fair = [row("global, prefix", 80, 20, 50, 100), row("prefix", 10, 90, 500, None)]
    text = "\n".join(verdicts(fair, bounds))
    assert "gap within 2U: yes" in text and "breaks 2U: yes" in text
    unfair = [row("global, prefix", 50, 50, 50, 100), row("prefix", 10, 90, 50, None)]
    text = "\n".join(verdicts(unfair, bounds))
    assert "gap within 2U: NO" in text and "breaks 2U: NO" in text
