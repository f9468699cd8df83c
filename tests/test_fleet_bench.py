"""`minivtc bench route`: the dispatcher's decision time, and the gateway's overhead, as smoke
runs (the numbers themselves are minivtc/fleet/README.md's, measured, never asserted)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from minivtc.bench.policy import bench_route, time_dispatcher_decisions


def test_bench_route_prints_a_median_and_its_range_for_each_number_of_clients(capsys):
    assert bench_route(quick=True, rounds=3) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [int(row[0]) for row in rows] == [10, 1000]
    for _, median, low, high in rows:
        assert 0 < float(low.strip("[,")) <= float(median) <= float(high.strip("]"))


def test_each_round_is_timed_after_a_warm_up_the_fleet_kept_full():
    # (time_dispatcher_decisions asserts that the fleet fills, and each decision binds one request)
    assert len(time_dispatcher_decisions(10, decisions=50, rounds=4)) == 4


@pytest.mark.slow
def test_bench_route_gateway_quick_measures_both_ways_through_real_processes():
    done = subprocess.run(
        [sys.executable, "-m", "minivtc.bench", "route", "--gateway", "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = dict(re.findall(r"^\s*(direct|through gateway)\s+(.+)$", done.stdout, re.M))
    assert set(rows) == {"direct", "through gateway"}, done.stdout
    for numbers in rows.values():
        median_ms, p99_ms, per_s = map(float, numbers.split())
        # 16 chunks at 20 a second, as a model decodes: 15 pauses of 50 ms at least, either way
        assert 750 <= median_ms <= p99_ms and per_s > 0
    cost = re.search(
        r"added (-?[\d.]+) ms at the median .* kept (\d+)% .* \((\d+) probes\)", done.stdout
    )
    assert cost and int(cost.group(3)) > 0, done.stdout  # /health answered while it served


@pytest.mark.slow
def test_bench_route_streams_serves_every_stream_and_reports_health_and_the_light_tenant():
    done = subprocess.run(
        [sys.executable, "-m", "minivtc.bench", "route", "--gateway", "--streams", "12"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "served: 12/12" in done.stdout, done.stdout
    health = re.search(r"codes \[200\], median (\d+) ms, worst (\d+) ms", done.stdout)
    assert health and int(health[1]) <= int(health[2]), done.stdout
    light = re.search(r"first token: (\d+) ms", done.stdout)
    assert light and int(light[1]) >= 500, done.stdout  # the stand-in backend waits 0.5 s
