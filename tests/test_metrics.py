"""The paper's metrics. Table 2 reproduced to two decimals from the artifact's stored A10G runs is
a graded test (minivtc/course/graded/test_a5_metric.py, run with this suite)."""

from __future__ import annotations

import pytest

from minivtc.course.graded.test_a5_metric import run  # a measured run, by name
from minivtc.sim import metrics
from minivtc.sim.metrics import Served


def test_service_is_spread_over_the_decode_span():
    r = Served(
        "a",
        arrival_s=0.0,
        input_tokens=10,
        output_tokens=20,
        first_token_latency_s=10.0,
        request_latency_s=30.0,
    )
    assert metrics.service([r], 0, 10)["a"] == 0  # nothing before the first token
    assert metrics.service([r], 10, 20)["a"] == pytest.approx(25.0)  # half of 50
    assert metrics.service([r], 0, 100)["a"] == pytest.approx(50.0)
    assert metrics.demand([r], 0, 1)["a"] == 50.0  # demand counts at arrival


def test_csv_round_trip(tmp_path):
    served, _ = run("VTC__real")
    metrics.write_requests(tmp_path / "r.csv", served)
    again = metrics.read_requests(tmp_path / "r.csv")
    assert [(r.client, r.input_tokens) for r in again] == [
        (r.client, r.input_tokens) for r in served
    ]
    assert (
        max(
            abs(a.request_latency_s - b.request_latency_s)
            for a, b in zip(again, served, strict=False)
        )
        < 1e-6
    )


def test_accumulated_difference_fcfs_grows_vtc_stays_bounded():
    fcfs, _ = run("FCFS__overload")
    vtc, _ = run("VTC__overload")
    _, f = metrics.accumulated_service_diff(fcfs, horizon=600)
    _, v = metrics.accumulated_service_diff(vtc, horizon=360)
    assert f[-1] > 200_000 and f == sorted(f)  # Figure 3(a): grows to ~249k at 570 s
    assert max(v) < 10_000  # oscillates 0.1k-7.7k, far under 2U = 40000


def test_profiled_cost_is_the_papers_fit():
    r = Served("a", 0.0, 256, 256, 1.0, 2.0)
    # Appendix B.2: the paper prints h = 2.1 n_p + n_q + 0.04 n_p n_q + 0.032 n_q^2 + 11.46,
    # the same fit scaled by 10 and rounded.
    paper = (2.1 * 256 + 256 + 0.04 * 256 * 256 + 0.032 * 256**2 + 11.46) / 10
    assert metrics.profiled_cost(r) == pytest.approx(paper, rel=0.01)


def test_jain_index():
    assert metrics.jain_index([1, 1, 1, 1]) == 1.0
    assert metrics.jain_index([1, 0, 0, 0]) == 0.25
