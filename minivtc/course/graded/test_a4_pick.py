"""Assignment a4, graded (2 of 3): who goes next, the pick and the lift (Lesson 5).

Graded by mechanism (`rubrics.A4_RUBRIC`): exact counters and dispatch orders against
Algorithm 2 on small hand-built cases (a fair-looking policy that is not VTC keeps its counters
within U, and only exact counters tell it apart): the pick (the smallest counter, ties to the
client seen first, whenever it joined the queue, first in first out within a client) and the
lift, both cases (fair preemption's lift, Lesson 11, is a4b's: `test_a4b_memory.py`). What
each request is charged is `test_a4_charges.py`'s; the theorems on workloads,
`test_a4_theorems.py`'s. Requests are moved as the engine moves them (`vtc_moves.py`)."""

from __future__ import annotations

from minivtc.course.graded.vtc_moves import (
    decode,
    dispatch_next,
    request,
)
from minivtc.fairness.vtc import VTC

__all__ = []


def test_ties_go_to_the_client_seen_first():
    """Among waiting clients with equal counters, peek picks the one seen first, whatever
    their queues' lengths."""
    vtc = VTC()
    for client, queued in (("z", 1), ("a", 3), ("m", 2)):  # equal counters, unequal queues
        for i in range(queued):
            vtc.add(request(client, 5, name=f"{client}{i}"), 0.0)
    order = [dispatch_next(vtc).client_id for _ in range(6)]
    assert order == ["z", "a", "m", "a", "m", "a"], (
        f"z (1 request), a (3) and m (2) seen in that order, every request 5 prompt tokens: "
        f"picked {order}, not z, a, m, a, m, a (VTC.peek: the smallest counter; among equal "
        "counters the client seen first, whatever the length of its queue)"
    )


def test_each_client_s_requests_go_in_arrival_order():
    """Within a client, peek offers the earliest waiting request, and dispatch takes it."""
    vtc = VTC()
    for i in range(3):
        vtc.add(request("a", 5, name=f"a{i}"), 0.0)
    vtc.add(request("b", 5, name="b0"), 0.0)
    order = [dispatch_next(vtc).request_id for _ in range(4)]
    assert order == ["a0", "b0", "a1", "a2"], (
        f"a's requests a0, a1, a2 and b's b0 arrived in that order, equal sizes: dispatched "
        f"{order}, not a0, b0, a1, a2 (Algorithm 2: the earliest request of the client with the "
        "smallest counter; each client's queue is first in, first out)"
    )


def test_the_lift_never_lowers_a_counter_and_lifts_to_the_smallest_waiting():
    """The lift raises a joining client to the smallest waiting counter, never lowers one."""
    vtc = VTC()
    vtc.add(request("a", 101), 0.0)
    vtc.add(request("b", 1), 0.0)
    dispatch_next(vtc), dispatch_next(vtc)  # a: 101, b: 1 (prompts only: no output charge)
    vtc.add(request("b", 1, name="b2"), 0.0)  # Q empty, b the last to leave: b stays at 1
    a_before, floor = vtc.counters["a"], vtc.counters["b"]  # b waits alone
    assert a_before > floor, (
        f"a's 101-token prompt and b's 1-token prompt dispatched: counters a {a_before}, b "
        f"{floor}; a's should be the larger (the prompt charge at dispatch, VTC.dispatch, is "
        "wrong: its own line's message says how)"
    )
    vtc.add(request("a", 1, name="a2"), 0.0)  # a joins above the floor
    assert vtc.counters["a"] == a_before, (
        f"a joined with counter {a_before} while the smallest waiting counter was {floor}: the "
        f"lift changed it to {vtc.counters['a']} (a lift is max(c_u, floor), it never lowers)"
    )
    vtc.add(request("c", 1), 0.0)  # new, at 0: lifted to the smallest waiting, b's
    assert vtc.counters["c"] == floor, (
        f"c joined while b ({floor}) and a ({a_before}) waited: lifted to {vtc.counters['c']}, "
        f"not to the smallest waiting counter, {floor}"
    )


def test_a_client_joining_an_empty_queue_is_lifted_to_the_last_to_leave():
    """A client joining an empty queue is lifted to the counter of the last client to leave
    it."""
    vtc = VTC()
    vtc.add(request("a", 2, name="a1"), 0.0)
    vtc.add(request("a", 2, name="a2"), 0.0)
    dispatch_next(vtc), dispatch_next(vtc)  # a: 4, and the queue is empty
    b = request("b", 2)
    vtc.add(b, 0.0)  # lifted to a's 4
    dispatch_next(vtc)  # b: 6, the last to leave
    decode(vtc, b, 10)  # b: 26, above a's 4
    last, other = vtc.counters["b"], vtc.counters["a"]
    vtc.add(request("c", 2), 0.0)
    assert vtc.counters["c"] == last, (
        f"c joined an empty queue whose last client to leave was b (counter {last}; a, who left"
        f" before, {other}): lifted to {vtc.counters['c']} (Algorithm 2: c_u <- max(c_u, c_l), "
        "l the last to leave)"
    )


def test_ties_go_to_the_client_seen_first_even_when_it_joins_the_queue_last():
    """The tie order is the order clients were first seen, not the order they joined Q."""
    vtc = VTC()
    vtc.add(request("a", 5, name="a0"), 0.0)
    vtc.add(request("b", 5, name="b0"), 0.0)
    dispatch_next(vtc), dispatch_next(vtc)  # a: 5, b: 5; Q empty, b the last to leave
    vtc.add(request("b", 5, name="b1"), 0.0)  # b joins first, at 5
    vtc.add(request("a", 5, name="a1"), 0.0)  # then a, at 5: a tie
    first = dispatch_next(vtc).request_id
    assert first == "a1", (
        f"a (seen first) and b both wait at counter 5, b having joined the queue first: "
        f"picked {first}, not a1 (ties go to the client seen first, however late it joined: "
        "VTC.peek and the counter structure's tie rank, LeastCounter.entry)"
    )


def test_a_waiting_client_is_never_lost_however_often_others_join_and_are_aborted():
    """The counter structure keeps every waiting client through many joins and departures (its
    dead entries dropped, the live ones kept): b waits all along at 0 while a, at 100, joins the
    queue and is aborted (the engine's `scheduler.remove`) 200 times; b is offered in the end."""
    vtc = VTC()
    vtc.add(request("a", 100, name="a0"), 0.0)
    vtc.add(request("b", 1, name="b0"), 0.0)  # b waits from now on, at 0
    dispatch_next(vtc)  # a0 (a tie at 0, a seen first): a at 100, above b
    for i in range(1, 201):
        r = request("a", 1, name=f"a{i}")
        vtc.add(r, 0.0)
        vtc.remove(r)
    offered = vtc.peek()
    assert offered is not None and offered.request_id == "b0", (
        f"b waited while a joined the queue and was aborted 200 times: peek offers "
        f"{offered and offered.request_id}, not b0 (the counter structure lost a waiting "
        "client: LeastCounter.push, compact, least, is_live)"
    )
    vtc.check_invariants()
