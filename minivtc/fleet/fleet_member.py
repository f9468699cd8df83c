"""One gateway among k in front of the same backends, sharing a store: `minivtc route --store
URL` and `minivtc simulate --gateways k --sync TAU` (the same code on the wall clock and the
virtual one).

Owns `Member`: what one gateway does with the store (`shared_store.py`) around its own
`Dispatcher`. The rule, ours (not the paper's): Algorithm 2 over the fleet, each gateway
deciding on its view of the counters, refreshed every tau seconds:

    add(r):  its client waits at no gateway we know of: lifted to the fleet's    add()
             smallest waiting counter; waiting at another one: no lift (backlogged)
    round:   i <- our waiting client with the smallest counter (the policy's)    bind()
             hold while one waiting at another gateway has a counter below       may_dispatch()
             i's by more than S, the lag our last sync revealed
             book i's room in the store; refused (others booked it): again       book()
    each tau: our charges out (atomic adds), lifts as floors (max), every        sync()
             counter in (`adopt`),
             who waits where, each backend's booked tokens; leases renewed

Without a store a gateway is the one dispatcher of `dispatcher.py`, exactly. Why the slack S:
a gateway sees its own client's counter fresh and the others' up to a sync late, so without it
two gateways each see their own client ahead, both hold, and each dispatches about one request
per sync (4 replicas, 2 gateways, skewed ingress: 1,131 tokens/s of 5,243 at tau = 1 s). S is
what the others charged one client between our last two syncs: if our client is the one
starved, the others charged little, S is small, and we hold as strictly as before.

The bound (ours). Assumptions: (A1) each gateway syncs at least every tau seconds; (A2) a client
backlogged in the fleet is, at every moment, in the latest snapshot of who waits that some
gateway published (true when each client's requests come through one gateway, or when it
keeps a request waiting at each gateway it uses); (A3) bookings are atomic (`book`: the
backends never queue, the premise of `dispatcher.py`'s proof); (A4) the cost is linear, w_p
<= w_q. Let C be the true counters (every charge at every gateway, sent or not), Delta the
most a gateway's view of a counter lags C at a dispatch (at most what the others charge one
client within 2 tau: its prompts, w_p L_input each, and its output, w_q a token), and S the
largest slack used (S <= Delta: a lag a sync revealed). Then for two clients a, b backlogged
throughout [t1, t2), at any t in it at which a's last dispatch was at t0 >= t1 + 2 tau,
C_a(t) <= C_b(t) + U + Delta + S, with Lemma 4.3's U = max(w_p L_input, w_q M), M the backends'
budgets, and their service gap over an interval after both such dispatches is within
2U + 2 Delta + 2S (<= 2U + 4 Delta).

Proof. At t0 the gateway g that dispatched a saw b waiting (A2: b waits at g, or g's last
sync, at most tau old, read b in another gateway's snapshot), and dispatched a only if its
view had V_a <= V_b + S (the policy's peek at g, with no slack, or `may_dispatch`; ties
allowed, so two gateways may both pick the same smallest counter at once: the second's view
lacks the first's charge, which Delta counts). Views lag and never lead: C_a(t0) - Delta <=
V_a <= V_b + S <= C_b(t0) + S <= C_b(t) + S (b, backlogged, is never lifted: `add` keeps the
counter of a client waiting elsewhere, and charges only raise). After t0, a is not dispatched
before t, so C_a grows by the prompt dispatched at t0 and the output of requests already
bound, each holding prompt + max_tokens on a backend (A3): at most U, as in Lemma 4.3's proof.
So C_a(t) <= C_b(t) + U + Delta + S, and by symmetry the counters are that close at both ends
of the interval; while backlogged neither is lifted, so each one's service is its counter's
growth (times its weight): within 2U + 2 Delta + 2S (Theorem 4.4's step). With tau -> 0, Delta
and S are what two gateways dispatch for one client at the same moment. The simulation
(`gateways.py`) measures Delta exactly and checks the gap against the bound over every
backlogged interval, the first 2 tau included; a live gateway states 2U + 4 Delta' with
Delta' the largest lag its syncs revealed. A store that is down (`StoreDown`): each gateway
serves on its own counters and a 1/k slice of each backend's budget, and no fleet-wide bound
is claimed meanwhile (k dispatchers on their own counters: the skewed collapse may come back);
when it is back, the counters re-converge by adding what each gateway charged meanwhile, none
reset.
minivtc/fleet/README.md; Lesson 14.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from minivtc.fairness.cost import fairness_bound
from minivtc.fleet.backend import Backend
from minivtc.fleet.dispatcher import Dispatcher
from minivtc.fleet.redis_store import RedisStore
from minivtc.fleet.shared_store import MemoryStore, PolicyBooks, Row, Served, StoreDown, SyncIn
from minivtc.requests.request import Request

__all__ = ["Member", "RETRY_S", "fleet_bound"]

RETRY_S = 1.0  # a store found down is tried again this often (each try may wait its timeout)


def fleet_bound(
    backends: list[Backend], weights: dict[str, float], lag: float, slack: float
) -> float:
    """2U + 2 Delta + 2S in counter units (the module docstring): U = max(w_p L_input, w_q M), M
    the backends' budgets, L_input the largest less one, scaled by 1 / the smallest weight
    (at most 1: a weight below 1 charges more per token), as `FairnessCheck` does."""
    largest, total = max(b.budget for b in backends), sum(b.budget for b in backends)
    scale = 1.0 / min(min(weights.values(), default=1.0), 1.0)
    return 2 * fairness_bound(largest - 1, total) * scale + 2 * lag + 2 * slack


class Member:
    """`name`: this gateway's, unique in the fleet (a restart's too: its bookings and who waits
    at it); `store`: the shared one; `sync_s`: tau; `gateway_id`: the row its service is kept
    under (`Served`; default `name`), the same across its restarts."""

    def __init__(
        self,
        name: str,
        store: RedisStore | MemoryStore,
        books: PolicyBooks,
        backends: list[Backend],
        sync_s: float,
        clock: Callable[[], float] = time.monotonic,
        gateway_id: str | None = None,
    ) -> None:
        if not sync_s >= 0:
            raise ValueError(f"the sync interval must be >= 0 seconds, got {sync_s}")
        self.name, self.store, self.books = name, store, books
        self.backends, self.sync_s, self.clock = backends, sync_s, clock
        self.epoch: str | None = None  # the store's, as last seen
        self.pulled: dict[str, float] = {}  # the counters as the last sync left them
        self.others_waiting: set[str] = set()  # clients waiting at other gateways (last sync)
        self.gateways = 1  # with an unexpired lease, at the last sync
        self.most_lag = 0.0  # Delta as the syncs reveal it (others' charges we had not seen)
        self.slack = 0.0  # the hold's: the lag the last sync revealed (the module docstring)
        self.down: str | None = None  # why the store is unreachable (None: it is up)
        self.next_sync = -math.inf  # when `due` says to sync again
        self.lifts: dict[str, tuple[float, float]] = {}  # client -> (its floor, lifted by)
        self.gateway_id = gateway_id or name
        self.served = Served()  # what this gateway served (`Served`)
        self.fleet_served: dict[str, dict[str, Row]] = {}  # every gateway's, as last synced

    # --- what the dispatcher and the gateway call -------------------------------------------

    def add(self, dispatcher: Dispatcher, request: Request, now: float) -> str | None:
        """`dispatcher.add`, with the fleet's lift: a client joining our queue that waits
        at no gateway is lifted to the smallest counter waiting in the fleet; one waiting at
        another gateway is backlogged, and keeps its counter (the module docstring)."""
        client = request.client_id
        joins = client not in self.books.waiting_clients()
        before = self.books.counter(client)
        reason = dispatcher.add(request, now)
        if reason is not None or not joins:
            return reason
        if client in self.others_waiting and before is not None:
            self.books.adopt({client: before})  # no lift: backlogged elsewhere
            return None
        waiting = (self.others_waiting | self.books.waiting_clients()) - {client}
        floors = [v for c in waiting if (v := self.books.counter(c)) is not None]
        if floors:  # (none waiting: the policy's own rule, the last to leave)
            self.books.adopt({client: max(before or 0.0, min(floors))})
        self.note_lift(client, before or 0.0)
        return None

    def note_lift(self, client: str, before: float) -> None:
        """A lift is a max, not a charge: sent as a floor (`SyncIn.lifts`), since two gateways
        lifting one client to the same level at once must raise it once, not twice (sent as
        adds, such lifts compound: 16 replicas, 4 gateways, balanced ingress blew the counters
        up to 2e10 in 60 s)."""
        after = self.books.counter(client)
        if after is not None and after > before:
            _, amount = self.lifts.get(client, (after, 0.0))
            # the store raises to the floor, then adds every charge sent: those made here
            # before the lift come off the floor, or they would count twice
            charged = before - self.pulled.get(client, 0.0) - amount
            self.lifts[client] = (after - charged, amount + after - before)

    def unsent(self) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        """(our counters, the charges not yet sent, the lifts' floors not yet sent)."""
        counters = self.books.counters()
        charges = {}
        for c, v in counters.items():
            amount = v - self.pulled.get(c, 0.0) - self.lifts.get(c, (0.0, 0.0))[1]
            if amount:
                charges[c] = amount
        return counters, charges, {c: target for c, (target, _) in self.lifts.items()}

    def may_dispatch(self, request: Request) -> bool:
        """Our head goes unless a client waiting elsewhere has a counter below its by more
        than the slack (the module docstring)."""
        mine = self.books.counter(request.client_id)
        for client in self.others_waiting:
            other = self.books.counter(client)
            if other is not None and mine is not None and other + self.slack < mine:
                return False
        return True

    def book(self, request: Request, backend: Backend) -> bool:
        """Book `request`'s room on `backend` in the store; False if the others took it (the
        backend's view of their bookings is refreshed: the round looks again)."""
        need = request.max_num_tokens
        if self.down is None:
            try:
                ok, total = self.store.book(
                    backend.name, self.booking(request), need, backend.budget
                )
                backend.elsewhere = total - backend.reserved - (need if ok else 0)
                return ok
            except StoreDown as e:
                self.fall_back(str(e))
        return backend.reserved + backend.elsewhere + need <= backend.budget  # our slice

    def rooms_grew(self) -> bool:
        """Nothing fits as we saw the others' bookings: read them again. True if some
        backend's room grew (others released bookings since the last sync)."""
        if self.down is not None:
            return False
        try:
            booked = self.store.booked_now([b.name for b in self.backends])
        except StoreDown as e:
            self.fall_back(str(e))
            return False
        return self.saw_rooms(booked)

    def release(self, backend: Backend, request: Request) -> None:
        """`request` left `backend` (finished, failed, given back): free its booking."""
        if self.down is None:
            try:
                self.store.release(backend.name, self.booking(request))
            except StoreDown as e:
                self.fall_back(str(e))

    def due(self, now: float) -> bool:
        return now >= self.next_sync

    def sync(self) -> bool:
        """Charges out, the fleet in (the module docstring). True if some backend's room
        grew (others released bookings): the dispatcher should look again (`wake`)."""
        now = self.clock()
        self.next_sync = now + (self.sync_s if self.down is None else max(self.sync_s, RETRY_S))
        counters, charges, lifts = self.unsent()
        rows = self.served.unsent() if self.epoch is not None else {}  # (first: read ours)
        sent = SyncIn(
            gateway=self.name,
            epoch=self.epoch,
            charges=charges,
            lifts=lifts,
            counters=counters,
            waiting=sorted(self.books.waiting_clients()),
            bookings={
                b.name: {self.key(i): n for i, n in b.requests.items()} for b in self.backends
            },
            backends=[b.name for b in self.backends],
            served_as=self.gateway_id,
            served=rows,
        )
        try:
            got = self.store.sync(sent)
        except StoreDown as e:
            self.fall_back(str(e))
            return False
        if got.epoch == self.epoch:  # others' charges we had not seen: the view's lag
            lag = max((v - counters.get(c, 0.0) for c, v in got.counters.items()), default=0.0)
            self.most_lag = max(self.most_lag, lag)
            self.slack = max(lag, 0.0)
        self.saw_served(got.epoch, got.served, rows)
        self.epoch, self.down, self.pulled, self.lifts = got.epoch, None, got.counters, {}
        self.books.adopt(got.counters)
        self.others_waiting = set().union(*(c for g, c in got.waiting.items() if g != self.name))
        self.gateways = max(got.gateways, 1)
        return self.saw_rooms(got.booked)

    def served_by(self) -> dict[str, dict[str, Row]]:
        """Gateway id -> client -> (requests, input, output): the others' as last synced, ours
        as it is now."""
        return self.fleet_served | {self.gateway_id: self.served.rows()}

    def view(self) -> dict:
        """For /fairness and /health: the store, the fleet as last seen, the bound's terms."""
        lag = self.most_lag
        return {
            "gateway": self.name,
            "store": str(getattr(self.store, "address", "in memory")),
            "store_up": self.down is None,
            "store_down": self.down,
            "gateways": self.gateways,
            "sync_s": self.sync_s,
            "waiting_elsewhere": sorted(self.others_waiting),
            "most_lag": round(self.most_lag, 3),
            "bound": None
            if self.down
            else fleet_bound(self.backends, self.books.weights(), lag, lag),
            "bound_is": "none while the store is down: each gateway on its own counters"
            if self.down
            else "2U + 4 Delta, Delta the most lag a sync revealed (ours: fleet/fleet_member.py)",
            "store_operations": self.store.operations,
        }

    # --- helpers ----------------------------------------------------------------------------

    def fall_back(self, why: str) -> None:
        """The store is down: serve on our own counters and a 1/k slice of each backend."""
        if self.down is None:
            for b in self.backends:
                b.elsewhere = b.budget - b.budget // self.gateways
        self.down, self.others_waiting = why, set()

    def saw_rooms(self, booked: dict[str, int]) -> bool:
        """Each backend's tokens booked by all gateways: ours are ours, the rest elsewhere."""
        grew = False
        for b in self.backends:
            elsewhere = max(booked.get(b.name, 0) - b.reserved, 0)
            grew |= elsewhere < b.elsewhere
            b.elsewhere = elsewhere
        return grew

    def saw_served(self, epoch: str, served: dict[str, dict[str, Row]], rows: dict) -> None:
        """A sync's answer about who served what (`Served`: our row read back at our
        first sync, every row again after a store that lost its data)."""
        if self.epoch is None:
            self.served.first_seen(served.get(self.gateway_id, {}))
        elif epoch != self.epoch:
            self.served.store_lost()
        else:
            self.served.wrote(rows)
        self.fleet_served = served

    def booking(self, request: Request) -> str:
        return self.key(request.request_id)

    def key(self, request_id: str) -> str:
        return f"{self.name}/{request_id}"
