"""Assignment a4b, graded (2 of 2): VTC and the step under fair memory and a prefix cache
(Lessons 10, 11 and 13), on a3's step and a4's VTC.

Graded by mechanism (`assignments.A4B_RUBRIC`): with blocks on demand a step grows the blocks
it writes, `make_room` admits within max_running and displaces the fair victim only beyond the
gap, and a request back from a preemption is not charged its prompt again (Lesson 10);
under fair preemption a client joining an empty queue is lifted near those that ran (Lesson
11); a cached prompt token is charged at w_c (Lesson 13). Requests are moved as the engine
moves them (`vtc_moves.py`)."""

from __future__ import annotations

import pytest

from minivtc.course.graded.driver import W_P
from minivtc.course.graded.test_a3_batching import unit_engine
from minivtc.course.graded.vtc_moves import (
    decode,
    dispatch_next,
    finish,
    preempt,
    request,
    with_fair_preemption,
)
from minivtc.engine.preemption import Fair
from minivtc.fairness.vtc import VTC
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Status

__all__ = []


def test_a_request_back_from_a_preemption_is_not_charged_again():
    """A preempted request dispatched again is not charged for its prompt a second time."""
    vtc = VTC()
    r = request("a", 10)
    vtc.add(r, 0.0)
    dispatch_next(vtc)
    preempt(vtc, r)
    dispatch_next(vtc)
    assert vtc.counters["a"] == W_P * 10, (
        f"the prompt was charged again on readmission: counter {vtc.counters['a']}, not "
        f"{W_P * 10} (VTC.dispatch: a request with num_preemptions > 0 was charged already)"
    )


def test_a_cached_prompt_is_charged_at_the_cached_weight():
    """A prompt's tokens found in the prefix cache cost w_c each at dispatch, not w_p."""
    vtc = VTC(cached_weight=0.25)
    r = request("a", 10)
    vtc.add(r, 0.0)
    r.num_cached = 6  # (admission sets it before dispatch)
    dispatch_next(vtc)
    expected = W_P * 4 + 0.25 * 6
    assert vtc.counters["a"] == pytest.approx(expected), (
        f"10 prompt tokens, 6 of them cached at w_c = 0.25: the counter is {vtc.counters['a']}, "
        f"not {expected} (cost.cache_discount)"
    )


def test_with_fair_preemption_a_client_joining_an_empty_queue_is_lifted_near_those_that_ran():
    """With fair preemption (gap 20), a client joining an empty queue is lifted to within the
    gap of every client that ran since the queue emptied, not only to the last to leave."""
    vtc = with_fair_preemption(VTC(), gap=20.0, pool_tokens=200)
    f = request("F", 1, 60)
    vtc.add(f, 0.0)
    dispatch_next(vtc)  # F: 1; the queue is empty
    decode(vtc, f, 1)  # F: 3
    e = request("E", 1, 2)
    vtc.add(e, 0.0)  # lifted to 3 (F, the last to leave and the only one that ran)
    assert vtc.counters["E"] == vtc.counters["F"], (
        f"E joined an empty queue whose last client to leave was F (counter "
        f"{vtc.counters['F']}): lifted to {vtc.counters['E']}, not to F's counter (the lift: "
        "c_u <- max(c_u, c_l), l the last to leave)"
    )
    dispatch_next(vtc)  # E: 4, the last to leave
    for n in range(30):  # F and E run while nobody waits; E finishes after its 2 tokens
        running = [f, e] if n < 2 else [f]
        for r in running:
            r.output_ids.append(1)
        vtc.on_decode(running)
        if n == 1:
            finish(vtc, e, "length")
    expected = vtc.counters["F"] - 20.0
    vtc.add(request("G", 1), 0.0)
    assert vtc.counters["G"] == pytest.approx(expected), (
        f"G joined an empty queue; E (counter {vtc.counters['E']}) left it last and F "
        f"({vtc.counters['F']}) ran since: with fair preemption's gap 20 G is lifted to "
        f"max(c_E, c_F - 20) = {expected}, got {vtc.counters['G']} (Algorithm 2's floor alone "
        "lets G displace F at once and then take every dispatch: the lift with fair preemption "
        "is the floor the engine set up, Lesson 11)"
    )


def test_with_fair_preemption_only_who_ran_while_the_queue_was_empty_raises_the_lift():
    """Fair preemption's lift counts the clients that ran since Q last emptied, not those that
    ran while someone waited."""
    vtc = with_fair_preemption(VTC(), gap=20.0, pool_tokens=200)
    f = request("F", 1, 60)
    vtc.add(f, 0.0)
    dispatch_next(vtc)  # F: 1; the queue is empty
    decode(vtc, f, 1)  # F: 3, running while nobody waits
    vtc.add(request("E", 1, 2), 0.0)  # E waits (lifted to F's 3): who ran is forgotten
    decode(vtc, f, 30)  # F: 63, while E waits
    dispatch_next(vtc)  # E: 4, the last to leave; nothing has run since the queue emptied
    vtc.add(request("G", 1), 0.0)
    assert vtc.counters["G"] == vtc.counters["E"], (
        f"G joined an empty queue the moment E ({vtc.counters['E']}) left it; F ran to "
        f"{vtc.counters['F']} while E waited, before the queue emptied: G is lifted to E's "
        f"counter, got {vtc.counters['G']} (FairLift counts who ran while Q was empty: "
        "VTC.on_decode tells it only then)"
    )


def test_with_blocks_on_demand_a_step_grows_the_blocks_it_writes():
    """With blocks on demand (reservation "none"), each step first gives the positions it
    writes their blocks."""
    engine = unit_engine(kv_tokens=64, block_size=4, reservation="none")
    r = engine.add_request([5] * 3, SamplingParams(max_tokens=9, ignore_eos=True))
    for n in range(1, 10):
        engine.step()
        if r.finish_reason is None:
            held = len(engine.allocator.block_tables[r.request_id])
            written = r.num_tokens - 1  # (the last token's K/V is written by the next step)
            assert held * 4 >= written, (
                f"after {n} steps the request wrote {written} positions but holds {held} blocks "
                "of 4: a step must grow the blocks first (Engine.grow)"
            )
    assert r.output_ids == [7] * 9 and engine.allocator.num_free_blocks == 16, (
        f"the request got {len(r.output_ids)} of 9 tokens, {engine.allocator.num_free_blocks} "
        "of 16 blocks free at the end (Engine.step: grow, run, append, retire)"
    )


def test_the_fair_victim_is_the_youngest_request_of_the_client_furthest_ahead():
    """Fair.choose: the running client with the highest counter, its youngest request;
    Fair.displace: that request, only if its client leads the waiting one by more than the gap
    (never with nothing running)."""
    vtc = VTC()
    a, b1, b2, c = (
        request("a", 10),
        request("b", 15, name="b1"),
        request("b", 15, name="b2"),
        request("c", 20),
    )
    for r in (a, b1, b2, c):
        vtc.add(r, 0.0)
    running = [dispatch_next(vtc) for _ in range(4)]  # counters a 10, b 30, c 20
    victim = Fair(vtc, gap=15.0).choose(running)
    assert victim is b2, (
        f"running a (counter 10), b1 and b2 (b: 30), c (20): the victim is {victim.request_id}, "
        "not b2, the youngest request of b, the client furthest ahead (Fair.choose)"
    )
    waiting = request("a", 5, name="a2")  # a's next request, at 10: b leads a by 20
    for gap, expected in ((15.0, b2), (20.0, None), (25.0, None)):
        got = Fair(vtc, gap).displace(waiting, running)
        assert got is expected, (
            f"b (30) leads waiting a (10) by 20; with gap {gap} displace gave "
            f"{got and got.request_id}, not {expected and expected.request_id} (a victim only "
            "when its client leads the waiting one by more than the gap)"
        )
    assert Fair(vtc, 0.0).displace(waiting, []) is None, "nothing runs: no victim"


def test_make_room_displaces_a_client_more_than_the_gap_ahead():
    """With the fair victim (gap 10), a request that does not fit is admitted at the first step
    its client trails a running one by more than the gap: that client's youngest request is
    preempted to make room (Engine.make_room), and not before."""
    engine = unit_engine(
        kv_tokens=40, scheduler=VTC(), reservation="none", victim="fair", preempt_gap=10.0
    )
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    a = [engine.add_request([5] * 8, params, client_id="A") for _ in range(4)]
    for _ in range(3):
        engine.step()  # A fills the pool; growing preempts its youngest, a[3]
    b = engine.add_request([5] * 8, SamplingParams(max_tokens=5, ignore_eos=True), client_id="B")
    gaps = []
    for _ in range(3):
        gaps.append(engine.scheduler.counters["A"] - engine.scheduler.counters["B"])
        engine.step()
        if b.status is Status.RUNNING:
            break
    assert b.status is Status.RUNNING and gaps[-1] > 10.0 >= max(gaps[:-1]), (
        f"A led waiting B by {gaps} at the start of each step (gap 10): B must be admitted at "
        f"the first step A leads by more than 10, not before; B is {b.status} after "
        f"{len(gaps)} steps (Engine.make_room: displace, preempt, try again)"
    )
    assert a[2].status is Status.WAITING and a[:2] == engine.running[:2], (
        f"running {[r.request_id for r in engine.running]}: the victim must be A's youngest "
        "running request"
    )


def test_make_room_admits_within_max_running_and_displaces_for_a_place_in_the_batch():
    """A full batch (max_running 2) admits no one, though the pool has room, until the waiting
    client trails a running one by more than the gap (10): then that client's youngest request
    leaves the batch to make a place (Engine.make_room), and the batch never exceeds 2."""
    engine = unit_engine(
        kv_tokens=400,
        scheduler=VTC(),
        max_running=2,
        reservation="none",
        victim="fair",
        preempt_gap=10.0,
    )
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    a = [engine.add_request([5] * 8, params, client_id="A") for _ in range(3)]
    engine.step()
    assert engine.running == a[:2] and a[2].status is Status.WAITING, (
        f"max_running 2, three of A's requests: running {[r.request_id for r in engine.running]},"
        " not A's first two (a full batch admits no one, and A trails no one: no victim)"
    )
    b = engine.add_request([5] * 8, params, client_id="B")
    gaps, sizes = [], []
    while b.status is not Status.RUNNING and len(gaps) < 10:
        gaps.append(engine.scheduler.counters["A"] - engine.scheduler.counters["B"])
        engine.step()
        sizes.append(len(engine.running))
    assert b.status is Status.RUNNING and gaps[-1] > 10.0 >= max(gaps[:-1], default=0.0), (
        f"A led waiting B by {gaps} at the start of each step (gap 10): B must be admitted at "
        f"the first step A leads by more than 10, not before; B is {b.status} (Engine.make_room: "
        "a full batch is room to make too)"
    )
    assert max(sizes) == 2 and a[1].status is Status.WAITING, (
        f"batch sizes {sizes} (max_running 2), A's second request {a[1].status}: B takes the "
        "place of A's youngest running request"
    )
