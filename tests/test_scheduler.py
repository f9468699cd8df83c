"""The scheduler interface, FCFS and RPM through the real engine loop.

No model: the course harness's `UnitRunner` stands in for the forward pass, so these tests
drive the same `Engine.step()`, admission and KV accounting that serve real tokens. The
paper's theorems for VTC are graded tests (`minivtc/course/graded/test_a4_theorems.py`, run with
this suite); VTC's own mechanics are `test_vtc.py`'s, the predictors `test_predictors.py`'s,
the names `test_policies.py`'s and the cost h `test_cost.py`'s.
"""

from __future__ import annotations

import pytest

from minivtc.course.graded.driver import Arrival, bound_u, drive, max_gap
from minivtc.fairness.scheduler import FCFS, RPM


def test_fcfs_gap_grows_without_bound():
    def gap(horizon):
        arrivals = [Arrival(t / 2, "A", 8, 8) for t in range(2 * horizon)]  # A sends 2x B's rate
        arrivals += [Arrival(float(t), "B", 8, 8) for t in range(horizon)]
        _, steps, _ = drive(FCFS(), arrivals, kv_tokens=64)
        return max_gap(steps, "A", "B")

    short, long = gap(200), gap(400)
    u = bound_u(8, 64)
    assert long > 1.6 * short and long > 4 * u


def test_rpm_counts_exactly_at_the_window_edges():
    arrivals = [Arrival(t, "a", 2, 2) for t in (0.0, 10.0, 59.9, 60.0, 69.9, 70.0)]
    arrivals += [Arrival(0.0, "b", 2, 2)]  # another client has its own window
    engine, _, rejected = drive(RPM(2), arrivals, kv_tokens=50)
    assert [a.time for a, _ in rejected] == [59.9, 69.9]  # 0.0 leaves the window at 60.0 exactly
    for _, e in rejected:
        assert (
            e.kind == "rate_limited" and "rate limit: client 'a' already has 2 requests" in e.reason
        )
    assert engine.client_tokens["a"].num_output == 4 * 2  # rejected requests never ran


def test_check_fairness_needs_a_vtc_family_scheduler():
    with pytest.raises(ValueError, match="check_fairness needs a policy that states a bound"):
        drive(FCFS(), [Arrival(0, "a", 1, 1)], 10, fairness=True)
