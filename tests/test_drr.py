"""Deficit Round Robin (`fairness/drr.py`): its turns, deficits and bookkeeping. Its bound and its
fairness on the paper's workloads are graded tests (minivtc/course/graded/test_a6_fair.py, run
with this suite)."""

from __future__ import annotations

from minivtc.fairness.drr import DRR
from minivtc.fairness.scheduler import admission_round
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request


def request(rid: str, client: str, n_p: int = 10, n_q: int = 4) -> Request:
    return Request(rid, client, [1] * n_p, SamplingParams(max_tokens=n_q), 0.0)


def admit_all(drr: DRR, admitted: list[str]):
    def admit(r: Request) -> bool:
        admitted.append(r.request_id)
        return True

    return admit


def test_a_turn_lasts_while_the_deficit_is_positive_then_passes():
    drr, admitted = DRR(quantum=25.0), []
    for i in range(3):
        drr.add(request(f"a{i}", "a"), 0.0)
        drr.add(request(f"b{i}", "b"), 0.0)
    drr.add(request("c0", "c", n_p=100), 0.0)
    admission_round(drr, admit_all(drr, admitted))
    # a: 25 -> 15 -> 5 -> -5 (three prompts of 10), then b the same, then c: 25 - 100.
    assert admitted == ["a0", "a1", "a2", "b0", "b1", "b2", "c0"]
    assert drr.deficits == {"a": -5.0, "b": -5.0, "c": -75.0} and not drr.active
    drr.check_invariants()


def test_decode_tokens_are_charged_and_a_negative_deficit_waits_turns():
    drr, admitted = DRR(quantum=10.0), []
    a, b = request("a0", "a", n_p=2), request("b0", "b", n_p=2)
    drr.add(a, 0.0)
    drr.add(b, 0.0)
    admission_round(drr, lambda r: r is a and admit_all(drr, admitted)(r))  # a fits, b does not
    a.output_ids += [7, 7, 7]
    drr.on_decode([a])  # three tokens at w_q = 2
    assert drr.deficits["a"] == 10 - 2 - 6
    drr.add(request("a1", "a"), 0.0)  # a rejoins the round: no credit banked, 2 -> 0
    assert drr.deficits["a"] == 0.0 and list(drr.active) == ["b", "a"]


def test_a_client_rejoining_keeps_its_debt_even_when_preempted():
    """A debt is not forgiven by leaving the queue: not when a client sends again, and not
    when its only request is preempted and requeued (else preemption would wipe it each time)."""
    drr, admitted = DRR(quantum=10.0), []
    a = request("a0", "a", n_p=2)
    drr.add(a, 0.0)
    admission_round(drr, admit_all(drr, admitted))
    a.output_ids += [7] * 7
    drr.on_decode([a])  # 10 - 2 - 14
    assert drr.deficits["a"] == -6.0 and not drr.active
    drr.requeue(a)  # preempted: back at the head of its (empty) queue
    assert drr.deficits["a"] == -6.0 and list(drr.active) == ["a"]
    drr.remove(a)
    drr.add(request("a1", "a"), 0.0)
    assert drr.deficits["a"] == -6.0


def test_a_refused_head_ends_the_round_without_losing_the_turn():
    drr = DRR(quantum=50.0)
    drr.add(request("a0", "a"), 0.0)
    drr.add(request("b0", "b"), 0.0)
    admission_round(drr, lambda r: False)
    assert drr.deficits["a"] == 50.0 and drr.turn_begun and list(drr.active) == ["a", "b"]
    admitted = []
    admission_round(drr, admit_all(drr, admitted))  # the same turn goes on: no second quantum
    assert admitted == ["a0", "b0"] and drr.deficits["a"] == 40.0


def test_abort_requeue_and_forget_keep_the_round_consistent():
    drr, admitted = DRR(), []
    a0, a1 = request("a0", "a"), request("a1", "a")
    drr.add(a0, 0.0)
    drr.add(a1, 0.0)
    drr.remove(a1)
    admission_round(drr, admit_all(drr, admitted))
    assert admitted == ["a0"] and not drr.active
    drr.requeue(a0)  # preempted: back at the head, the client back in the round
    assert list(drr.waiting()) == [a0] and list(drr.active) == ["a"]
    drr.check_invariants()
    drr.remove(a0)
    assert drr.ledger.forget(["a"], 0.0) == ["a"] and "a" not in drr.deficits
