"""The paper's workloads: each named suite has the clients, rates and lengths it says it has.

Rates are checked the way the paper states them, in requests per minute per client, by counting
each client's arrivals minute by minute. Nothing here simulates: a workload is a list of arrivals.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass

import pytest

from minivtc.sim.workloads import (
    REAL_TRACE,
    WORKLOADS,
    TraceRequest,
    client_name,
    poisson,
    read_trace,
    uniform,
    workload,
    write_trace,
)

C0, C1, C2, C3 = (client_name(i) for i in range(4))


@dataclass(frozen=True)
class Uniform:
    """What a constant-rate suite should be: each client's rpm in each of its phases."""

    duration: float
    phases: list[dict[str, int]]  # one {client: rpm} per phase, phases of equal length
    lengths: tuple[int, int] = (256, 256)
    on_off: tuple[str, ...] = ()  # clients silent in odd minutes (of the first phase)
    mentions: tuple[str, ...] = ()  # what the workload's description must say

    def rpm(self, client: str, minute: int) -> int:
        phase_minutes = int(self.duration // 60) // len(self.phases)
        phase = minute // phase_minutes
        off = client in self.on_off and phase == 0 and minute % 2 == 1
        return 0 if off else self.phases[phase][client]

    def phase_starts(self) -> set[int]:
        phase_minutes = int(self.duration // 60) // len(self.phases)
        return {p * phase_minutes for p in range(len(self.phases))}


UNIFORM = {
    "overload": Uniform(
        360, [{C0: 90, C1: 180}], mentions=("2 clients", "90", "180", "256/256", "Fig. 3")
    ),
    "overload-multi": Uniform(
        360,
        [{C0: 24, C1: 24, C2: 24} | {client_name(i): 36 for i in range(3, 8)}],
        mentions=("8 clients", "3 at 24 rpm", "5 at 36 rpm", "256/256", "Table 6"),
    ),
    "overload-weighted": Uniform(
        360, [{C0: 48, C1: 48, C2: 72, C3: 96}], mentions=("4 clients", "48/48/72/96", "Fig. 16")
    ),
    "proportional": Uniform(
        600, [{C0: 15, C1: 30, C2: 90}], mentions=("3 clients", "15/30/90", "Fig. 4")
    ),
    "on_off_less": Uniform(
        600,
        [{C0: 30, C1: 120}],
        on_off=(C0,),
        mentions=("30 rpm ON/OFF every 60 s", "120 rpm", "Fig. 5"),
    ),
    "on_off_overload": Uniform(
        600,
        [{C0: 120, C1: 180}],
        on_off=(C0,),
        mentions=("120 rpm ON/OFF every 60 s", "180 rpm", "Fig. 6"),
    ),
    # Figure 10: 300 s at [0.5 ON/OFF, 2] req/s, then [1, 1], then [0.5, 1.5]
    "dist_shift": Uniform(
        900,
        [{C0: 30, C1: 120}, {C0: 60, C1: 60}, {C0: 30, C1: 90}],
        on_off=(C0,),
        mentions=("15 min", "three phases", "Fig. 10"),
    ),
}


def per_minute(trace: list[TraceRequest], client: str) -> Counter[int]:
    return Counter(int(r.arrival_s // 60) for r in trace if r.client == client)


def test_every_named_workload_is_specified_here():
    poissons, others = {"poisson_short_long", "poisson_short_long_2"}, {"increase", "real"}
    assert set(WORKLOADS) == set(UNIFORM) | poissons | others


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_each_workload_builds_sorted_and_deterministic(name):
    w = workload(name)
    trace = w.make()
    assert w.name == name and len(trace) > 100
    assert all(isinstance(r, TraceRequest) for r in trace)
    arrivals = [r.arrival_s for r in trace]
    assert arrivals == sorted(arrivals) and arrivals[0] >= 0
    assert all(r.input_tokens > 0 and r.output_tokens > 0 for r in trace)
    # it spans its horizon, and does not run on far past it
    assert 0.95 * w.duration < arrivals[-1] < w.duration + 5
    assert w.make() == trace  # seeded: the same trace every time


@pytest.mark.parametrize("name", list(UNIFORM))
def test_uniform_workloads_send_each_clients_rpm_every_minute(name):
    """Every full minute carries exactly the rpm the paper gives; the first minute of a phase
    may miss one request (the first arrival is drawn within two periods of its start), and an
    ON/OFF client is silent in its OFF minutes."""
    spec, w = UNIFORM[name], workload(name)
    trace = w.make()
    assert w.duration == spec.duration
    assert {r.client for r in trace} == set(spec.phases[0])
    assert {(r.input_tokens, r.output_tokens) for r in trace} == {spec.lengths}
    for client in spec.phases[0]:
        counts = per_minute(trace, client)
        # the artifact's first arrival: U(0, 1) / rate + 1 / rate
        first = min(r.arrival_s for r in trace if r.client == client)
        assert 60 / spec.rpm(client, 0) <= first < 120 / spec.rpm(client, 0), (client, first)
        for m in range(int(spec.duration // 60)):
            want = spec.rpm(client, m)
            ok = {want - 1, want} if m in spec.phase_starts() and want else {want}
            assert counts[m] in ok, (client, m, counts[m], want)


@pytest.mark.parametrize("name", list(UNIFORM))
def test_descriptions_state_what_the_workloads_are(name):
    for text in UNIFORM[name].mentions:
        assert text in workload(name).description, text


def test_on_off_clients_are_silent_in_their_off_periods():
    for name in ("on_off_less", "on_off_overload", "dist_shift"):
        trace = workload(name).make()
        first_5_minutes = Counter(
            int(r.arrival_s // 60) for r in trace if r.client == C0 and r.arrival_s < 300
        )
        assert not first_5_minutes[1] and not first_5_minutes[3], name  # OFF
        assert min(first_5_minutes[m] for m in (0, 2, 4)) >= 29, name  # ON
        # the other client never pauses
        assert len(per_minute(trace, C1)) >= workload(name).duration // 60, name


def test_only_the_weighted_workload_has_weights():
    """Figure 16: weighted VTC with weights 1:2:3:4, one per client of the trace."""
    for name, w in WORKLOADS.items():
        if name != "overload-weighted":
            assert w.weights is None, name
    w = workload("overload-weighted")
    assert w.weights == {C0: 1.0, C1: 2.0, C2: 3.0, C3: 4.0}
    assert set(w.weights) == {r.client for r in w.make()}
    assert "weights 1:2:3:4" in w.description


def test_increase_ramps_client_1_from_12_to_120_rpm():
    """Figure 9: client 0 steady at 30 rpm, client 1's rate rising linearly from 12 to 120 rpm."""
    trace = workload("increase").make()
    steady = per_minute(trace, C0)
    assert all(steady[m] == 30 for m in range(1, 10)) and steady[0] in (29, 30)
    ramp = [r.arrival_s for r in trace if r.client == C1]
    gaps = [b - a for a, b in itertools.pairwise(ramp)]
    assert 60 / (ramp[0] - 0.0) == pytest.approx(12)  # the first gap, at 0.2 req/s
    assert 60 / gaps[-1] == pytest.approx(120, rel=0.02)
    assert all(b <= a + 1e-9 for a, b in itertools.pairwise(gaps))  # never slows down
    assert len(ramp) == pytest.approx((12 + 120) / 2 * 10, abs=1)  # the mean rate for 10 min
    counts = per_minute(trace, C1)
    assert all(counts[m] < counts[m + 1] for m in range(9))
    assert {(r.input_tokens, r.output_tokens) for r in trace} == {(256, 256)}


POISSON = {  # name: {client: (rpm, (input, output))}; Figures 7 and 8
    "poisson_short_long": {C0: (480, (64, 64)), C1: (90, (256, 256))},
    "poisson_short_long_2": {C0: (480, (512, 32)), C1: (90, (32, 512))},
}


@pytest.mark.parametrize("name", list(POISSON))
def test_poisson_workloads_rates_and_lengths(name):
    w, spec = workload(name), POISSON[name]
    trace = w.make()
    for client, (rpm, lengths) in spec.items():
        mine = [r for r in trace if r.client == client]
        assert {(r.input_tokens, r.output_tokens) for r in mine} == {lengths}
        expected = rpm * w.duration / 60
        assert abs(len(mine) - expected) < 4 * math.sqrt(expected), client  # 4 sigma
        assert f"{rpm} rpm" in w.description
    # one merged Poisson process: exponential gaps (coefficient of variation 1), not even spacing
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(trace)]
    assert statistics.fmean(gaps) == pytest.approx(60 / 570, rel=0.05)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.1)


def test_poisson_is_seeded():
    args = ([8.0, 1.5], 60, [(64, 64), (256, 256)])
    assert poisson(*args, seed=1) == poisson(*args, seed=1)
    assert poisson(*args, seed=1) != poisson(*args, seed=2)
    assert poisson(*args) == poisson(*args, seed=42)  # the artifact seeds 42
    assert uniform([1.0], 60, seed=1) != uniform([1.0], 60, seed=2)


def test_real_trace_is_the_papers_27_clients():
    """Table 2's trace: the description's client and request counts, 600 s, the artifact's
    per-client counts, lengths under 1024 (longer chats were dropped when it was sampled)."""
    w = workload("real")
    trace = w.make()
    stated = re.search(r"(\d+) clients, (\d+) requests", w.description)
    clients, requests = int(stated[1]), int(stated[2])
    assert (clients, requests) == (27, 1500)
    counts = Counter(r.client for r in trace)
    assert len(counts) == clients and len(trace) == requests
    assert sorted(counts.values(), reverse=True)[:6] == [296, 262, 199, 120, 67, 66]
    assert trace[0].arrival_s == 0.0 and trace[-1].arrival_s == w.duration == 600
    assert all(0 < r.input_tokens < 1024 and 0 < r.output_tokens < 1024 for r in trace)
    assert statistics.fmean(r.input_tokens for r in trace) == pytest.approx(136.3, abs=0.05)
    assert statistics.fmean(r.output_tokens for r in trace) == pytest.approx(256.2, abs=0.05)


def test_trace_csv_round_trips_exactly(tmp_path):
    real = read_trace(REAL_TRACE)
    write_trace(tmp_path / "real.csv", real)
    assert read_trace(tmp_path / "real.csv") == real
    # a generated trace keeps arrivals to the microsecond: written once, it is a fixed point
    trace = workload("poisson_short_long").make()
    write_trace(tmp_path / "a.csv", trace)
    once = read_trace(tmp_path / "a.csv")
    assert [(r.client, r.input_tokens, r.output_tokens) for r in once] == [
        (r.client, r.input_tokens, r.output_tokens) for r in trace
    ]
    assert max(abs(a.arrival_s - b.arrival_s) for a, b in zip(once, trace, strict=True)) <= 5e-7
    write_trace(tmp_path / "b.csv", once)
    assert (tmp_path / "b.csv").read_bytes() == (tmp_path / "a.csv").read_bytes()


def test_read_trace_sorts_by_arrival(tmp_path):
    trace = uniform([1.0, 2.0], 30)
    write_trace(tmp_path / "forward.csv", trace)
    write_trace(tmp_path / "backward.csv", trace[::-1])
    assert read_trace(tmp_path / "backward.csv") == read_trace(tmp_path / "forward.csv")


HEADER = "client,arrival_s,input_tokens,output_tokens\n"


def test_a_trace_missing_a_column_names_it(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("client,arrival_s,input_tokens\na,0.5,10\n")
    with pytest.raises(ValueError, match=r"bad\.csv.*missing columns \['output_tokens'\]"):
        read_trace(path)


def test_a_non_numeric_field_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text(HEADER + "a,0.5,10,10\nb,abc,10,10\n")
    with pytest.raises(ValueError, match=r"bad\.csv.*line 3"):
        read_trace(path)


def test_a_short_row_is_a_value_error(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text(HEADER + "a,0.5,10\n")
    with pytest.raises(ValueError, match=r"bad\.csv"):
        read_trace(path)


@pytest.mark.parametrize("row", ["a,0.5,-3,10", "a,0.5,10,-1", "a,nan,10,10"])
def test_impossible_values_are_rejected(tmp_path, row):
    path = tmp_path / "bad.csv"
    path.write_text(HEADER + row + "\n")
    with pytest.raises(ValueError):
        read_trace(path)


def test_unknown_workload_names_the_choices():
    with pytest.raises(ValueError, match="unknown workload 'nope'") as e:
        workload("nope")
    assert all(name in str(e.value) for name in WORKLOADS)
    assert workload("overload") is WORKLOADS["overload"]


def test_the_max_tokens_column_is_optional_and_round_trips(tmp_path):
    plain = [TraceRequest("a", 0.5, 10, 20)]
    limited = [TraceRequest("a", 0.5, 10, 20, 1024), TraceRequest("b", 1.0, 5, 7)]
    for trace in (plain, limited):
        write_trace(tmp_path / "t.csv", trace)
        assert read_trace(tmp_path / "t.csv") == trace
    header = (tmp_path / "t.csv").read_text().splitlines()[0]
    assert header.endswith(",max_tokens")
    write_trace(tmp_path / "t.csv", plain)
    assert "max_tokens" not in (tmp_path / "t.csv").read_text()  # the paper's format


def test_a_limit_below_the_length_is_refused(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text(HEADER.rstrip("\n") + ",max_tokens\na,0.5,10,20,19\n")
    with pytest.raises(ValueError, match=r"bad\.csv, line 2: max_tokens 19 < output_tokens 20"):
        read_trace(path)
