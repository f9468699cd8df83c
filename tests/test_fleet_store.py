"""The store k gateways share (`fleet/shared_store.py`, `fleet/redis_store.py`) and one gateway's
membership of the fleet (`fleet/fleet_member.py`): the in-process store and a real Redis
server (the `redis_url` fixture: a redis-server of the test's own on loopback) behave alike."""

from __future__ import annotations

import time

import pytest

from minivtc.fairness.vtc import VTC
from minivtc.fleet.backend import Backend
from minivtc.fleet.dispatcher import Dispatcher
from minivtc.fleet.fleet_member import Member
from minivtc.fleet.redis_store import RedisStore, parse_store_url
from minivtc.fleet.shared_store import MemoryStore, PolicyBooks, SyncIn
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def request(i: int, client: str, prompt: int = 10, out: int = 10) -> Request:
    return Request(f"r{i}", client, [0] * prompt, SamplingParams(max_tokens=out), 0.0)


def sync_in(gateway, epoch, charges=None, counters=None, waiting=(), bookings=None, lifts=None):
    charges = charges or {}
    counters = counters or charges
    return SyncIn(
        gateway, epoch, charges, lifts or {}, counters, list(waiting), bookings or {}, ["b"]
    )


@pytest.fixture(params=["memory", "redis"])
def make_store(request):
    """A factory of stores (a fresh key prefix each: two fleets in one Redis server)."""
    if request.param == "memory":
        return lambda lease_s=10.0: MemoryStore(time.monotonic, lease_s=lease_s)
    url = request.getfixturevalue("redis_url")
    prefixes = iter(range(1000))
    tag = f"t{time.monotonic_ns()}"
    return lambda lease_s=10.0: RedisStore(parse_store_url(url), f"{tag}-{next(prefixes)}", lease_s)


def test_store_urls_are_read_or_refused_with_a_reason():
    a = parse_store_url("redis://:s3cret@10.0.0.5:6380/2")
    assert (a.host, a.port, a.db, a.password) == ("10.0.0.5", 6380, 2, "s3cret")
    assert "s3cret" not in str(a)
    assert parse_store_url("redis://localhost").port == 6379
    for bad in ["http://h:1/0", "redis://h:70000/0", "redis://h:1/x", "redis:///0"]:
        with pytest.raises(ValueError, match="--store"):
            parse_store_url(bad)


def test_a_wrong_password_or_no_server_is_a_clear_error_at_start(redis_url):
    right = parse_store_url(redis_url)
    RedisStore(right).check()
    wrong = parse_store_url(redis_url.replace(right.password or "", "wrong"))
    with pytest.raises(ValueError, match="refused the password"):
        RedisStore(wrong).check()
    with pytest.raises(ValueError, match="needs a password"):
        RedisStore(parse_store_url(f"redis://127.0.0.1:{right.port}/0")).check()
    with pytest.raises(ValueError, match="cannot reach"):
        RedisStore(parse_store_url("redis://127.0.0.1:1/0")).check()


def test_vtc_adopts_the_fleets_counters_and_still_picks_the_smallest():
    """A waiting counter lowered by `adopt` must be found at once (the heap keeps lower
    bounds); a client known only to the fleet gets its counter, not a fresh 0."""
    vtc = VTC()
    vtc.add(request(0, "a"), 0.0)
    vtc.add(request(1, "b"), 0.0)
    vtc.ledger.adopt({"a": 10.0, "b": 5.0})
    assert vtc.peek().client_id == "b"
    vtc.ledger.adopt({"a": 1.0, "c": 7.0})
    assert vtc.peek().client_id == "a"
    assert vtc.ledger.counter("c") == 7.0 and vtc.ledger.counter("b") == 5.0
    vtc.add(request(2, "c"), 0.0)  # joins lifted to the smallest waiting (1.0): stays at 7
    assert vtc.ledger.counter("c") == 7.0


def test_charges_from_two_gateways_add_up_and_a_late_gateway_changes_no_one(make_store):
    store = make_store()
    e = store.sync(sync_in("g1", None)).epoch
    store.sync(sync_in("g1", e, {"a": 3.0, "b": 1.0}))
    store.sync(sync_in("g2", e, {"a": 2.0}))
    late = store.sync(sync_in("g3", None, counters={"a": 0.0, "z": 0.0}))  # floors, not sums
    assert late.counters == {"a": 5.0, "b": 1.0, "z": 0.0}
    lost = store.sync(sync_in("g1", "another epoch", {"a": 1.0}, {"a": 9.0}))  # store was reset
    assert lost.counters["a"] == 9.0  # the larger of the two, never a sum


def test_two_gateways_lifting_one_client_at_once_raise_it_once(make_store):
    """A lift is a max: sent as adds, two gateways' lifts of one client would sum (and
    compound as clients leapfrog)."""
    store = make_store()
    e = store.sync(sync_in("g1", None, {"a": 10.0})).epoch
    store.sync(sync_in("g1", e, {"a": 10.0}))
    store.sync(sync_in("g1", e, lifts={"a": 50.0}, charges={"a": 2.0}))
    got = store.sync(sync_in("g2", e, lifts={"a": 50.0}, charges={"a": 3.0}))
    assert got.counters["a"] == 55.0  # lifted once to 50, then both gateways' charges


def test_two_gateways_never_over_book_a_backend_and_dead_leases_expire(make_store):
    store = make_store(lease_s=0.3)
    assert store.book("b", "g1/r1", 60, 100) == (True, 60)
    assert store.book("b", "g2/r1", 60, 100) == (False, 60)
    assert store.book("b", "g2/r2", 40, 100) == (True, 100)
    store.release("b", "g2/r2")
    assert store.booked_now(["b"]) == {"b": 60}
    time.sleep(0.4)  # g1 died: never renewed
    assert store.booked_now(["b"]) == {"b": 0}
    e = store.sync(sync_in("g2", None)).epoch
    store.book("b", "g2/r3", 70, 100)
    for _ in range(3):  # renewed at each sync: it lives on
        time.sleep(0.15)
        got = store.sync(sync_in("g2", e, bookings={"b": {"g2/r3": 70}}))
    assert got.booked == {"b": 70}


def test_each_gateway_publishes_who_waits_there(make_store):
    store = make_store()
    e = store.sync(sync_in("g1", None, waiting=["a"])).epoch
    store.sync(sync_in("g2", None, waiting=["b", "c"]))
    got = store.sync(sync_in("g1", e, waiting=[]))  # a snapshot replaces the last
    assert got.waiting == {"g1": set(), "g2": {"b", "c"}} and got.gateways == 2


def members(k: int, store: MemoryStore, clock: Clock, budget: int = 100, first: int = 0):
    """k gateways in front of one backend, each a dispatcher with its own VTC."""
    out = []
    for g in range(first, first + k):
        backends = [Backend("b", budget)]
        vtc = VTC()
        member = Member(f"g{g}", store, PolicyBooks(vtc), backends, 0.05, clock)
        out.append((Dispatcher(vtc, backends, member=member), member, vtc))
    return out


def test_a_gateway_holds_its_client_while_a_smaller_counter_waits_at_another():
    clock = Clock()
    store = MemoryStore(clock)
    (d1, m1, v1), (d2, m2, v2) = members(2, store, clock, budget=1000)
    m1.add(d1, request(0, "heavy"), 0.0)
    m2.add(d2, request(1, "light"), 0.0)
    v1.ledger.adopt({"heavy": 50.0})  # heavy was served before
    m1.sync(), m2.sync(), m1.sync()
    assert m1.others_waiting == {"light"} and v2.ledger.counter("heavy") == 50.0
    assert d1.bind() == []  # light (0) waits at g2: heavy (50) holds
    assert [r.request_id for r, _ in d2.bind()] == ["r1"]
    m2.sync(), m1.sync()
    assert [r.request_id for r, _ in d1.bind()] == ["r0"]


def test_bookings_are_the_fleets_and_a_refused_room_is_looked_at_again():
    clock = Clock()
    store = MemoryStore(clock)
    (d1, m1, _), (d2, m2, _) = members(2, store, clock, budget=30)
    m1.add(d1, request(0, "a"), 0.0)
    m2.add(d2, request(1, "b"), 0.0)
    assert len(d1.bind()) == 1  # 20 of 30 tokens
    assert d2.bind() == []  # its view said 30 free: the store refused, and now it knows
    assert d2.backends[0].elsewhere == 20
    assert d1.where["r0"].name == "b"


def test_a_client_backlogged_elsewhere_is_not_lifted_and_one_back_from_idle_is():
    clock = Clock()
    store = MemoryStore(clock)
    (d1, m1, v1), (d2, m2, v2) = members(2, store, clock, budget=1000)
    m1.add(d1, request(0, "a"), 0.0)
    m1.add(d1, request(1, "b"), 0.0)
    v1.ledger.adopt({"a": 5.0, "b": 40.0})
    m1.sync(), m2.sync()
    m2.add(d2, request(2, "b"), 0.0)  # b waits at g1: no lift at g2
    assert v2.ledger.counter("b") == 40.0
    m2.add(d2, request(3, "c"), 0.0)  # c waits nowhere: lifted to the fleet's smallest (a's 5)
    assert v2.ledger.counter("c") == 5.0


def test_a_dead_store_leaves_each_gateway_its_slice_and_its_return_loses_no_charge():
    clock = Clock()
    store = MemoryStore(clock)
    (d1, m1, v1), (d2, m2, _) = members(2, store, clock, budget=100)
    m1.sync(), m2.sync(), m1.sync()
    v1.ledger.adopt({"a": 10.0})
    m1.sync()
    store.up = False
    assert m1.sync() is False and m1.down is not None
    assert d1.backends[0].elsewhere == 50  # half of the backend: two gateways were seen
    assert m1.view()["store_up"] is False
    m1.add(d1, request(0, "a", prompt=30, out=10), 0.0)
    assert len(d1.bind()) == 1  # booked in its own slice (40 of 50)
    charged = v1.ledger.counter("a")
    store.up = True
    m1.sync()
    assert m1.down is None and store.counters["a"] == charged  # its charges, none reset
    assert store.booked_now(["b"]) == {"b": 40}  # its booking, known to the fleet again


def test_a_gateway_started_late_lifts_and_lowers_no_one():
    clock = Clock()
    store = MemoryStore(clock)
    ((d1, m1, v1),) = members(1, store, clock)
    m1.add(d1, request(0, "a"), 0.0)
    v1.ledger.adopt({"a": 30.0, "b": 12.0})
    m1.sync()
    before = dict(store.counters)
    ((d2, m2, v2),) = members(1, store, clock)  # a fresh gateway (or one restarted)
    m2.sync()
    assert store.counters == before  # its empty books changed nobody's counter
    # and it decides on the fleet's counters
    assert v2.ledger.counter("a") == 30.0 and v2.ledger.counter("b") == 12.0


def test_each_gateways_service_is_its_row_and_a_restart_counts_on_from_it(make_store):
    """What each gateway served rides on its syncs (no round trip of its own) and comes back
    to every gateway; a restarted gateway (same id, new process) adds to its row."""
    store = make_store()

    def member(name: str, gateway_id: str) -> Member:
        return Member(
            name, store, PolicyBooks(VTC()), [Backend("b", 100)], 0.05, gateway_id=gateway_id
        )

    a, b = member("a:1", "host:8101"), member("b:1", "host:8102")
    a.served.record("x", 10, 20)
    a.served.record("x", 4, 6)
    b.served.record("y", 1, 2)
    for m in (a, b, a, b):
        m.sync()
    assert store.operations == 4  # one round trip a sync, as without the rows
    assert b.served_by() == {"host:8101": {"x": (2, 14, 26)}, "host:8102": {"y": (1, 1, 2)}}
    again = member("a:2", "host:8101")  # gateway a restarted: a new process, the same id
    again.served.record("x", 5, 5)
    again.sync(), again.sync(), b.sync()
    assert b.served_by()["host:8101"] == {"x": (3, 19, 31)}
    assert again.served_by() == b.served_by()


def test_a_store_that_lost_its_data_gets_every_row_again():
    store = MemoryStore(time.monotonic)
    a = Member("a:1", store, PolicyBooks(VTC()), [Backend("b", 100)], 0.05, gateway_id="a")
    a.served.record("x", 3, 4)
    a.sync(), a.sync()
    assert store.served == {"a": {"x": (1, 3, 4)}}
    store.served.clear()
    store.epoch = "a new epoch"  # the store restarted empty
    a.sync(), a.sync()
    assert store.served == {"a": {"x": (1, 3, 4)}}
