"""`BacklogWatch` (Theorem 4.4's quantity, measured on a run) against the graded harness's
`max_gap` over the same steps, and Definition 4.1's backlogged under preemption."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from minivtc.course.graded import driver as harness
from minivtc.course.graded.driver import UnitRunner, drive, max_gap, random_arrivals, workloads
from minivtc.engine.engine import Engine
from minivtc.engine.engine_config import EngineConfig
from minivtc.engine.kv_pool import BlockAllocator
from minivtc.fairness.vtc import VTC
from minivtc.requests.params import SamplingParams
from minivtc.sim.backlog import BacklogWatch, watch_rejoining
from tests.test_engine import memory


@settings(max_examples=40, deadline=None)
@given(workloads, st.sampled_from(["full", "none"]))
def test_the_watch_measures_what_max_gap_measures_over_every_pair(w, reservation):
    """The same run stepped through a watch: its worst gap is the worst `max_gap` of all
    pairs (an all-pairs running maximum against one pair at a time)."""
    arrivals = random_arrivals(w)
    watches = []
    engine_step = harness.Engine.step

    def step(engine):  # the harness steps the engine; route each step through a watch
        if not watches:
            watches.append(BacklogWatch(engine))
        watch = watches[0]
        harness.Engine.step = engine_step  # (the watch calls the real step)
        try:
            return watch.step()
        finally:
            harness.Engine.step = step

    harness.Engine.step = step
    try:
        _, steps, _ = drive(VTC(), arrivals, w["kv_tokens"], **memory(reservation, victim="fair"))
    finally:
        harness.Engine.step = engine_step
    clients = sorted({a.client for a in arrivals})
    expected = max(
        (max_gap(steps, f, g) for f, g in itertools.combinations(clients, 2)), default=0.0
    )
    assert len(steps) > 0 and watches[0].worst == expected


def pool_full_of_f() -> Engine:
    """F's two requests of 9 tokens fill 19 of 20 one-token blocks after a step: a request
    admitted next (2 tokens free) is the latest victim of the following step's growth."""
    clock = [0.0]
    engine = Engine(
        UnitRunner(clock),
        BlockAllocator(20, 1),
        VTC(),
        10**6,
        eos_id=-1,
        clock=lambda: clock[0],
        config=EngineConfig(reservation="none", victim="latest"),
    )
    for _ in range(2):
        engine.add_request([5] * 9, PARAMS, client_id="F")
    return engine


PARAMS = SamplingParams(max_tokens=10, ignore_eos=True)


def test_a_client_with_another_request_waiting_stays_backlogged_through_a_preemption():
    """G's first request is admitted, then preempted in the same step; G's second waited all
    along, so G never left the queue: it stays backlogged."""
    engine = pool_full_of_f()
    watch = BacklogWatch(engine)
    watch.step()
    g = engine.add_request([6], PARAMS, client_id="G")
    engine.add_request([6], PARAMS, client_id="G")  # G also waits throughout
    watch.step()
    assert g.num_preemptions == 1 and watch.rejoined == set()
    assert "G" in watch.waiting()


def test_watch_rejoining_sees_a_client_leave_and_rejoin_within_a_step():
    """G's only request is admitted, then preempted in the same step: G left the queue inside
    the step (Definition 4.1), though it waits before and after it."""
    engine = pool_full_of_f()
    rejoined = watch_rejoining(engine)
    engine.step()
    g = engine.add_request([6], PARAMS, client_id="G")
    engine.step()
    assert g.num_preemptions == 1 and rejoined == {"G"}


def test_drive_records_each_step_s_clock_counters_and_admissions_on_the_pool_it_is_given():
    """A's request takes the whole pool; B waits for it to finish. Each `Step` has the clock
    after the step, the counters after it and the clients admitted in it; the engine ran on
    the allocator passed in."""
    pool = BlockAllocator(4, 1)
    arrivals = [harness.Arrival(0.0, "A", 2, 2), harness.Arrival(0.0, "B", 2, 2)]
    engine, steps, _ = drive(VTC(), arrivals, 4, allocator=pool)
    assert engine.allocator is pool
    assert [s.now for s in steps] == [1.0, 2.0, 3.0, 4.0]
    assert [s.admitted for s in steps] == [["A"], [], ["B"], []]
    # w_p = 1 per prompt token at dispatch, w_q = 2 per token; B waits at 0 until A finishes
    assert steps[0].counters == {"A": 4.0, "B": 0.0} and steps[1].counters["A"] == 6.0
    assert steps[2].counters["B"] == 4.0 and steps[0].backlogged == {"B"}


@settings(max_examples=30, deadline=None)
@given(workloads)
def test_max_gap_is_the_largest_rise_or_fall_of_service_difference_within_a_backlogged_stretch(w):
    """The curve Lesson 11 draws, read back: within each stretch of steps in which both were
    backlogged (the rest NaN), the largest rise or fall of W_f - W_g is `max_gap`."""
    arrivals = random_arrivals(w)
    _, steps, _ = drive(VTC(), arrivals, w["kv_tokens"], reservation="none", victim="fair")
    clients = sorted({a.client for a in arrivals})
    for f, g in itertools.combinations(clients, 2):
        total, both = harness.service_difference(steps, f, g)
        assert len(total) == len(both) == len(steps)
        best, start = 0.0, None
        for before, now in zip([0.0, *total], both, strict=False):
            if now != now:  # NaN: the stretch ends
                start = None
                continue
            if start is None:
                start, lo, hi = before, before, before
            lo, hi = min(lo, now), max(hi, now)
            best = max(best, hi - lo)
        assert abs(best - max_gap(steps, f, g)) < 1e-9, (f, g)


def test_watch_joins_records_the_counters_as_each_client_first_joins_the_queue():
    """G joins while F waits: lifted to F's counter (the smallest waiting), recorded then."""
    vtc = VTC()
    joined = harness.watch_joins(vtc)
    arrivals = [harness.Arrival(0.0, "F", 4, 4)] * 2 + [harness.Arrival(2.0, "G", 1, 1)]
    drive(vtc, arrivals, 8)
    assert joined["F"] == {"F": 0.0}
    assert joined["G"]["G"] == joined["G"]["F"] > 0  # lifted level with F, who waits


def test_draw_workload_draws_what_the_graded_strategy_draws():
    import random

    w = harness.draw_workload(random.Random(3))
    assert set(w) == {"n_clients", "n_requests", "kv_tokens", "seed", "bursty"}
    assert len(random_arrivals(w)) == w["n_requests"]
    assert 2 <= w["n_clients"] <= 5 and 5 <= w["n_requests"] <= 60 and 40 <= w["kv_tokens"] <= 160
