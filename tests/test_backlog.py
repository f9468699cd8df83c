"""`BacklogWatch` (Theorem 4.4's quantity, measured on a run) against the graded harness's
`max_gap` over the same steps, and Definition 4.1's backlogged under preemption."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from minivtc.course.graded import driver as harness
from minivtc.course.graded.driver import UnitRunner, drive, max_gap, random_arrivals, workloads
from minivtc.engine.engine import Engine
from minivtc.engine.kv_pool import BlockAllocator
from minivtc.engine.options import EngineOptions
from minivtc.fairness.vtc import VTC
from minivtc.harness.backlog import BacklogWatch, watch_rejoining
from minivtc.vocab.params import SamplingParams
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
        options=EngineOptions(reservation="none", victim="latest"),
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
