"""The dispatcher (`fleet/dispatcher.py`), its backends and routes: no model, no engine."""

from __future__ import annotations

import random

import pytest

from minivtc.fairness.scheduler import FCFS
from minivtc.fairness.vtc import VTC
from minivtc.fleet.backend import Backend, LeastLoaded, PrefixAware, RoundRobin, make_route
from minivtc.fleet.dispatcher import Dispatcher
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request


def request(i: int, client: str, prompt: int = 2, max_tokens: int = 2, prefix: int = 0):
    return Request(f"r{i}", client, [prefix] * prompt, SamplingParams(max_tokens=max_tokens), 0.0)


def fleet(*budgets: int, scheduler=None, route=None) -> Dispatcher:
    backends = [Backend(f"b{k}", b) for k, b in enumerate(budgets)]
    scheduler = scheduler or VTC()
    return Dispatcher(scheduler, backends, route, check_fairness=scheduler.ledger.keeps_counters)


def test_a_request_is_bound_only_where_it_fits_and_the_round_stops_at_the_first_that_does_not():
    d = fleet(12, 12, scheduler=FCFS())
    for i, size in enumerate([5, 5, 5, 1]):
        d.add(request(i, "a", size, size), 0.0)
    bound = d.bind()
    assert [(r.request_id, b.name) for r, b in bound] == [("r0", "b0"), ("r1", "b1")]
    assert d.waiting() == 2  # r2 fits nowhere now, and r3 (which would) is not skipped to
    d.check_invariants()


def test_a_request_larger_than_every_budget_is_refused_not_queued():
    d = fleet(8, 16)
    assert d.add(request(0, "a", 10, 10), 0.0) is not None
    assert d.add(request(1, "a", 8, 8), 0.0) is None
    assert d.waiting() == 1


def test_finishing_frees_the_room_and_counts_the_backend():
    d = fleet(4)
    d.add(request(0, "a"), 0.0)
    d.add(request(1, "b"), 0.0)
    ((first, backend),) = d.bind()
    assert d.bind() == [] and backend.reserved == 4
    assert d.on_finish(first) is backend and backend.reserved == 0 and backend.served == 1
    assert [r.request_id for r, _ in d.bind()] == ["r1"]


def test_vtc_decides_who_and_the_route_decides_where():
    """The smallest counter goes first whatever the route; least-loaded fills the emptiest."""
    d = fleet(20, 20)
    for i in range(3):
        d.add(request(i, "heavy"), 0.0)
    d.add(request(3, "light"), 0.0)
    order = [(r.client_id, b.name) for r, b in d.bind()]
    # heavy's first dispatch raises its counter: light (still at 0) is next, then heavy again
    assert order == [("heavy", "b0"), ("light", "b1"), ("heavy", "b0"), ("heavy", "b1")]


def test_prefix_aware_routing_prefers_the_backend_that_served_the_prefix_while_it_has_room():
    route = PrefixAware()
    d = fleet(8, 8, 8, scheduler=FCFS(), route=route)
    d.add(request(0, "a", prefix=7), 0.0)
    d.add(request(1, "b", prefix=9), 0.0)
    d.add(request(2, "a", prefix=7), 0.0)
    d.add(request(3, "a", prefix=7), 0.0)
    where = [(r.request_id, b.name) for r, b in d.bind()]
    # r2 joins r0 on b0 (its prefix); r3 too would, but b0 is full: least-loaded then
    assert where == [("r0", "b0"), ("r1", "b1"), ("r2", "b0"), ("r3", "b2")]


def test_per_replica_routes_choose_from_every_backend():
    backends = [Backend(f"b{k}", 10) for k in range(3)]
    rr = RoundRobin()
    assert [rr.choose(request(i, "a"), backends).name for i in range(4)] == ["b0", "b1", "b2", "b0"]
    backends[0].reserve(request(9, "a"))
    assert LeastLoaded().choose(request(0, "a"), backends).name == "b1"
    assert make_route("random", seed=1).choose(request(0, "a"), backends) in backends
    with pytest.raises(ValueError, match="unknown route"):
        make_route("nearest")


def test_a_request_given_back_is_uncharged_and_first_of_its_client_again():
    vtc = VTC()
    d = fleet(100, scheduler=vtc)
    d.add(request(0, "a", prompt=10), 0.0)
    d.add(request(1, "a", prompt=3), 0.0)
    d.add(request(2, "b", prompt=3), 0.0)
    bound = d.bind()
    assert vtc.counters["a"] == 13  # both of a's prompts charged (b's lift follows a)
    first = bound[0][0]
    d.give_back(first)  # the backend answered 429 before serving it
    assert vtc.counters["a"] == 3 and bound[0][1].reserved == sum(
        r.max_num_tokens for r, _ in bound[1:]
    )
    assert vtc.peek() is first
    d.check_invariants()


def test_a_give_back_never_takes_a_counter_below_the_smallest_waiting_one():
    vtc = VTC()
    d = fleet(14, scheduler=vtc)
    d.add(request(0, "a", prompt=10), 0.0)  # 12 tokens: nothing else fits beside it
    ((r, _),) = d.bind()
    d.on_decode([])  # (no tokens yet)
    d.add(request(1, "b", prompt=4), 0.0)  # b joins, lifted to a's 10
    d.add(request(2, "a", prompt=1), 0.0)
    assert vtc.counters["b"] == 10
    d.give_back(r)
    assert vtc.counters["a"] == 10  # refunded to the floor (b's 10), not to 0


def test_check_fairness_fails_when_the_stated_bound_is_broken():
    """LCF (no lift) lets a client back from idle hold a stale counter: the check sees the
    spread pass U = max(w_p L_input, w_q M), M the fleet's memory (2 x 8 tokens: U = 32)."""
    d = fleet(8, 8, scheduler=VTC(lift=False))
    for i in range(40):
        d.add(request(i, "a", prompt=2, max_tokens=2), 0.0)
    for _ in range(5):  # 20 of a's requests run and finish; a's counter climbs to 120
        for r, _ in d.bind():
            r.output_ids += [3, 3]
            d.on_decode([r])
            d.on_finish(r)
    with pytest.raises(AssertionError, match="Lemma 4.3 violated"):
        d.add(request(99, "b"), 0.0)  # b joins at 0, more than U below a
    assert fleet(8, 8).fairness.u == 32


class FullScan(Dispatcher):
    """The reference: every round looks at every backend (no memory of the stuck head)."""

    def room_for(self, request: Request) -> list[Backend]:
        need = request.max_num_tokens
        return [b for b in self.backends if b.healthy and b.reserved + need <= b.budget]


@pytest.mark.parametrize("route", ["least-loaded", "prefix", "round-robin", "random"])
def test_the_stuck_head_tried_only_where_room_grew_binds_as_a_full_scan_would(route):
    """Random arrivals, finishes, give-backs and health changes on two dispatchers, one that
    retries the head that fitted nowhere only on the backends whose room grew since, and one
    that scans every backend every time: the same bindings, in the same order."""
    rng = random.Random(route)
    for _ in range(40):
        budgets = [rng.randint(4, 24) for _ in range(rng.randint(1, 5))]
        pair = [
            cls(VTC(), [Backend(f"b{k}", b) for k, b in enumerate(budgets)], make_route(route))
            for cls in (Dispatcher, FullScan)
        ]
        made: list[dict[str, Request]] = [{}, {}]  # each dispatcher's own request objects
        running: list[str] = []
        for i in range(80):
            op = rng.random()
            if op < 0.5:
                args = (
                    i,
                    rng.choice("abc"),
                    rng.randint(1, 6),
                    rng.randint(1, 4),
                    rng.randint(0, 2),
                )
                for d, mine in zip(pair, made, strict=True):
                    mine[f"r{i}"] = request(*args)
                    d.add(mine[f"r{i}"], 0.0)
            elif op < 0.8 and running:
                rid = running.pop(rng.randrange(len(running)))
                back = rng.random() < 0.2  # refused by its backend: given back, uncharged
                for d, mine in zip(pair, made, strict=True):
                    (d.give_back if back else d.on_finish)(mine[rid])
            elif op < 0.9:
                k, healthy = rng.randrange(len(budgets)), rng.random() < 0.7
                for d in pair:
                    d.backends[k].healthy = healthy
                    if healthy:
                        d.wake()  # as the gateway's health check does on a return
            if rng.random() < 0.4:
                continue  # no round yet: several rooms may grow before the next one
            fast, full = ([(r.request_id, b.name) for r, b in d.bind()] for d in pair)
            assert fast == full, (route, budgets, i)
            running += [rid for rid, _ in fast]
        for d in pair:
            d.check_invariants()
