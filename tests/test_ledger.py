"""A policy's books (`ledger.py`): apart from the loop's interface, and corrected soundly.

The loop's interface (`Scheduler`) holds what the engine's loop calls and nothing else; the
books other layers read are the ledger's. `adopt` (counters kept fleet-wide) must keep the
least-counter heap sound: a counter set lower than its heap key needs a new entry.
"""

from __future__ import annotations

import pytest

from minivtc.fairness.drr import DRR
from minivtc.fairness.ledger import NO_BOOKS
from minivtc.fairness.scheduler import FCFS, RPM, Scheduler, admission_round
from minivtc.fairness.vtc import VTC
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request

LOOP = {"add", "peek", "dispatch", "on_decode", "on_finish", "requeue", "remove"}
LOOP |= {"waiting", "num_waiting", "check_invariants"}


def request(rid: str, client: str, n_p: int = 10) -> Request:
    return Request(rid, client, [1] * n_p, SamplingParams(max_tokens=4), 0.0)


def test_the_loops_interface_is_the_loops_calls_and_the_books_are_the_ledgers():
    public = {n for n in vars(Scheduler) if not n.startswith("_")}
    assert public - {"name", "cost", "ledger"} == LOOP
    for policy in (FCFS(), RPM(3), DRR(), VTC()):
        assert not hasattr(policy, "accounts") and not hasattr(policy, "settle")
    assert FCFS().ledger is NO_BOOKS and VTC().ledger is not NO_BOOKS


def test_adopt_sets_counters_and_the_pick_follows_them():
    vtc = VTC()
    for rid, client in (("a0", "a"), ("b0", "b")):
        vtc.add(request(rid, client), 0.0)
    vtc.ledger.adopt({"a": 50.0})
    assert vtc.peek().client_id == "b" and vtc.ledger.counter("a") == 50.0
    vtc.check_invariants()
    vtc.ledger.adopt({"a": 10.0, "b": 100.0})  # a falls below its heap key: a new entry
    vtc.check_invariants()
    assert vtc.peek().client_id == "a"
    assert sorted(vtc.ledger.waiting_counters()) == [10.0, 100.0]


def test_adopt_meets_a_client_not_seen_yet_who_then_joins_lifted():
    vtc = VTC()
    vtc.add(request("a0", "a"), 0.0)
    vtc.ledger.adopt({"a": 40.0, "new": 5.0})
    assert vtc.ledger.counter("new") == 5.0 and vtc.peek().client_id == "a"
    vtc.add(request("n0", "new"), 0.0)
    assert vtc.ledger.counter("new") == 40.0  # Algorithm 2's lift, from the adopted counter
    vtc.check_invariants()


@pytest.mark.parametrize("policy", [FCFS(), RPM(3), DRR()], ids=["fcfs", "rpm", "drr"])
def test_a_policy_without_counters_has_none_to_adopt(policy):
    policy.add(request("a0", "a"), 0.0)
    policy.ledger.adopt({"a": 7.0})
    assert policy.ledger.counter("a") is None and policy.ledger.waiting_counters() == []


def test_unadmit_refunds_and_the_caller_requeues():
    vtc = VTC()
    r = request("a0", "a")
    vtc.add(r, 0.0)
    admission_round(vtc, lambda req: True)
    assert vtc.ledger.counter("a") == 10.0 and vtc.ledger.dispatch_charge(r) == 10.0
    vtc.ledger.unadmit(r)
    assert vtc.ledger.counter("a") == 0.0 and vtc.peek() is None  # the ledger leaves Q alone
    vtc.requeue(r)
    assert vtc.peek() is r
    vtc.check_invariants()


def test_counters_are_the_clients_counters_and_none_for_a_policy_without():
    vtc, drr = VTC(), DRR()
    for policy in (vtc, drr):
        policy.add(request("a0", "a"), 0.0)
        policy.add(request("b0", "b", n_p=4), 0.0)
        admission_round(policy, lambda r: True)
    assert vtc.ledger.counters() == {"a": 10.0, "b": 4.0}
    assert set(drr.ledger.accounts()) == {"a", "b"} and drr.ledger.counters() == {}
    assert FCFS().ledger.counters() == {}


def test_drr_reports_the_bound_it_states():
    drr = DRR(quantum=64.0)
    assert drr.ledger.gap_bound(100.0) == drr.gap_bound(100.0) == 2 * (100.0 + 64.0)
    assert FCFS().ledger.gap_bound(100.0) is None and VTC().ledger.gap_bound(100.0) == 200.0
