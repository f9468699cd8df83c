"""The simulated fleet (`fleet/replicas.py`, `experiments/fleet_runs.py`): real engines behind the
dispatcher on one virtual clock, against the field's per-replica routing."""

from __future__ import annotations

import csv
import json

import pytest

from minivtc.cli.main import main
from minivtc.fleet.replica_workloads import FLEET_WORKLOADS, scaled
from minivtc.fleet.replicas import simulate_fleet
from minivtc.sim import metrics
from minivtc.sim.simulator import simulate
from minivtc.sim.workloads import workload

END = 75.0  # the constructed workloads' first 75 s: both tenants backlogged from 30 s on


def first(trace):
    return [r for r in trace if r.arrival_s < END]


def shares(result, start: float = 30.0, end: float = END) -> dict[str, float]:
    """Each client's service (linear price, tokens) over the span, backlogged throughout."""
    return metrics.service(result.served, start, end)


def test_one_replica_behind_the_dispatcher_is_the_single_engine():
    """VTC on the dispatcher, FCFS on the one replica behind it: the same requests served at
    the same times as VTC inside the engine (binding only where it fits never queues)."""
    trace = [r for r in workload("overload").make() if r.arrival_s < 60]
    fleet = simulate_fleet(trace, 1, "global", check_fairness=True, watch_backlog=True)
    alone = simulate(trace, "vtc", reservation="full", watch_backlog=True)
    order = lambda s: (s.arrival_s, s.client)  # noqa: E731
    assert sorted(fleet.result.served, key=order) == sorted(alone.served, key=order)
    assert fleet.result.backlogged_gap == alone.backlogged_gap
    assert set(fleet.replicas) == {0}


@pytest.fixture(scope="module")
def affinity():
    """Four replicas: 'system' (a shared system prompt) and 'flood', both backlogged."""
    trace = first(FLEET_WORKLOADS["affinity"].make(4))
    runs = {
        "global/prefix": simulate_fleet(
            trace, 4, "global", "prefix", check_fairness=True, watch_backlog=True
        ),
        "prefix": simulate_fleet(trace, 4, "prefix", watch_backlog=True),
    }
    return runs


@pytest.mark.slow
def test_cache_affinity_with_per_replica_counters_breaks_the_fleets_bound(affinity):
    """Every 'system' request goes to one replica, at most that replica's worth; 'flood'
    takes the other three: the backlogged gap passes 2U of the fleet."""
    run = affinity["prefix"].result
    got = shares(run)
    assert got["system"] < got["flood"] / 2
    bound = affinity["global/prefix"].result.bound
    assert run.backlogged_gap > bound


def test_the_global_dispatcher_keeps_it_with_prefix_aware_routing_on(affinity):
    run = affinity["global/prefix"].result
    got = shares(run)
    assert got["system"] == pytest.approx(got["flood"], rel=0.05)
    assert run.backlogged_gap <= run.bound
    assert run.bound == 2 * max(1 * 255, 2 * 4 * 10000)  # 2U, M the fleet's memory


@pytest.mark.slow
def test_a_four_to_one_weighting_holds_across_the_fleet_only_with_global_counters():
    w = FLEET_WORKLOADS["weighted"]
    trace = first(w.make(4))
    fair = shares(simulate_fleet(trace, 4, "global", "prefix", weights=w.weights).result)
    split = shares(simulate_fleet(trace, 4, "prefix", weights=w.weights).result)
    assert fair["gold"] / fair["free"] == pytest.approx(4.0, rel=0.1)
    assert split["gold"] / split["free"] < 1.0  # 4:1 on gold's one replica only


def test_scaled_sends_each_client_n_times_as_often():
    trace = workload("real").make()[:100]
    more = scaled(trace, 3)
    assert len(more) == 300 and [r.arrival_s for r in more] == sorted(r.arrival_s for r in more)
    assert {r.client for r in more} == {r.client for r in trace}


def test_simulate_replicas_writes_a_replica_column_and_a_table_per_replica(tmp_path):
    out = tmp_path / "fleet"
    args = ["simulate", "--workload", "affinity", "--replicas", "2", "--routing", "prefix"]
    assert main([*args, "--out", str(out)]) == 0
    with open(out / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    on = {(r["client"], r["replica"]) for r in rows}
    assert len({replica for client, replica in on if client == "system"}) == 1  # affinity
    summary = json.loads((out / "metrics.json").read_text())
    assert [r["replica"] for r in summary["per_replica"]] == [0, 1]
    assert summary["replicas"] == 2 and summary["routing"] == "prefix"
    assert sum(r["served"] for r in summary["per_replica"]) == summary["served"] == len(rows)


def test_simulate_replicas_refuses_what_a_replica_does_not_model(tmp_path, capsys):
    args = ["simulate", "--workload", "overload", "--replicas", "2", "--out", str(tmp_path)]
    assert main([*args, "--reservation", "none"]) == 2
    assert "--reservation: not with --replicas" in capsys.readouterr().err


def test_a_stale_view_keeps_lemma_4_3_and_the_gap_within_its_extra_term():
    """Tokens and finishes heard 2 s late: the check (Lemma 4.3 on the counters the
    dispatcher sees) holds after every event, and the measured gap stays within 2U + 2 w_q G,
    G the most output tokens a client had unseen (`News`, `dispatcher.py`)."""
    trace = first(FLEET_WORKLOADS["affinity"].make(2))
    exact = simulate_fleet(trace, 2, "global", check_fairness=True, watch_backlog=True)
    stale = simulate_fleet(
        trace, 2, "global", check_fairness=True, watch_backlog=True, staleness=2.0
    )
    assert stale.result.bound > exact.result.bound == 2 * 2 * 2 * 10000
    assert stale.result.backlogged_gap <= stale.result.bound
    assert stale.result.backlogged_gap > exact.result.backlogged_gap  # late news costs fairness
    with pytest.raises(ValueError, match="only with routing 'global'"):
        simulate_fleet(trace, 2, "round-robin", staleness=1.0)
