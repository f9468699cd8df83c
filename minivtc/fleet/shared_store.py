"""What k gateways share: every client's counter, every backend's room, who waits where.

Owns the store's small interface, in two implementations that behave alike (the tests run one
against the other's expectations):

- `redis_store.RedisStore`: Redis or Valkey, through redis-py, at `--store
  redis://[:password@]host:port/db`; every key under a prefix (two fleets share one store), a
  timeout on every call, each operation one round trip (a Lua script, atomic in the server);
- `MemoryStore`: the same in one process, on a clock it is given: the simulator's store
  (`minivtc simulate --gateways k`) and the tests'.

Three operations. `sync` (every tau seconds per gateway): raise the counters it lifted to
their floors (a max), add its charges since its last sync (an atomic add each: they commute,
so no charge is ever lost or counted twice),
publish the clients waiting at it and what it served (`Served`, below), renew its bookings'
leases, and read back every counter, who waits at the other gateways, each backend's booked
tokens and what each gateway served. `book`: reserve a request's
prompt + max_tokens on a backend only if the backend's bookings, all gateways' together, stay
within its budget (atomically: two gateways never over-book a backend). `release`: free it.
(`booked_now` reads the backends' booked tokens between syncs, when nothing fits.)

Leases: a gateway's bookings and its snapshot of who waits there carry an expiry it renews at
each sync, so a gateway that dies frees its bookings within `lease_s`, its clients no longer
counted as waiting. The
store's `epoch` (a random id set once) tells a gateway that the store lost its data (restarted
without persistence): it then sends its counters as floors (the store keeps the larger), not
its charges, so no counter is reset and none is counted twice.

`PolicyBooks` is the one place the fleet reads or writes a policy's counters (the gateway and
the simulator go through it).

Which gateway served what: per gateway, per client, the requests served and their input and
output tokens, for `/fairness`, `/metrics` (a `gateway` label) and the gateway's dashboard.
`Served` is one gateway's own book of it. Each row is written by its gateway only, under its
`gateway_id` (`host:port`, the same after a restart: a restarted gateway goes on adding to its
row, and the label set stays gateways x clients), so the store keeps it by plain overwrite, no
merge: the row's whole value rides on the sync the gateway already makes (`SyncIn.served`), only
for the clients whose row changed since, and every row comes back in its answer
(`SyncOut.served`): no round trip of its own. A gateway that (re)starts reads its row back at
its first sync and counts on from it (`base`); one that finds the store lost its data (a new
epoch) writes every row again. Without a store the book is the gateway's alone, under its own
id. Not the counters: what a client was charged is the policy's (`PolicyBooks`); this is what
each gateway passed on.

Plain Python; no asyncio. minivtc/fleet/README.md; Lesson 14.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from minivtc.fairness.scheduler import Scheduler

__all__ = ["MemoryStore", "PolicyBooks", "Row", "STORE_TIMEOUT_S", "Served", "StoreDown", "SyncIn"]
__all__ += ["SyncOut", "as_json"]

Row = tuple[int, int, int]  # (requests, input tokens, output tokens)
STORE_TIMEOUT_S = 0.5  # every call's: a store slower than this is down (`StoreDown`)


class StoreDown(Exception):
    """The store did not answer (unreachable, timed out, refused us)."""


@dataclass(frozen=True)
class SyncIn:
    """What a gateway sends at a sync (`Store.sync`)."""

    gateway: str
    epoch: str | None  # the store's epoch it last saw (None: never synced)
    charges: dict[str, float]  # client -> what it was charged here since the last sync
    lifts: dict[str, float]  # client -> the floor it was lifted to here (a max, not an add)
    counters: dict[str, float]  # client -> its counter here (the floors after a lost store)
    waiting: list[str]  # the clients with a request waiting at this gateway
    bookings: dict[str, dict[str, int]]  # backend -> booking id -> tokens (renewed)
    backends: list[str]  # whose booked tokens to read back
    served_as: str = ""  # this gateway's id (`Served`: stable across its restarts)
    served: dict[str, Row] = field(default_factory=dict)  # client -> its whole row, if changed


@dataclass(frozen=True)
class SyncOut:
    """What the store answers."""

    epoch: str
    counters: dict[str, float]
    waiting: dict[str, set[str]]  # gateway -> the clients waiting there (its last snapshot)
    booked: dict[str, int]  # backend -> tokens booked on it by every gateway
    gateways: int  # gateways with an unexpired lease
    served: dict[str, dict[str, Row]] = field(default_factory=dict)  # gateway id -> its rows


class PolicyBooks:
    """The policy's counters as the fleet reads and writes them: the one adapter between a
    gateway's policy and the store (its ledger: `accounts` to read, `adopt` to write)."""

    def __init__(self, policy: Scheduler) -> None:
        if not policy.ledger.keeps_counters:
            raise ValueError(
                f"{policy.name} keeps no counters: a shared store needs the VTC family"
            )
        self.policy = policy

    def counters(self) -> dict[str, float]:
        return self.policy.ledger.counters()

    def counter(self, client: str) -> float | None:
        return self.policy.ledger.counter(client)

    def waiting_clients(self) -> set[str]:
        return {r.client_id for r in self.policy.waiting()}

    def weights(self) -> dict[str, float]:
        return self.policy.ledger.client_weights()

    def adopt(self, counters: dict[str, float]) -> None:
        """Set these clients' counters to the fleet's values (the others stay)."""
        self.policy.ledger.adopt(counters)


@dataclass
class MemoryStore:
    """The store in one process, on `clock` (seconds): the simulator's and the tests'."""

    clock: Callable[[], float]
    lease_s: float = 10.0
    epoch: str = field(default_factory=lambda: uuid.uuid4().hex)
    counters: dict[str, float] = field(default_factory=dict)
    waiting: dict[str, set[str]] = field(default_factory=dict)  # gateway -> its clients
    gateways: dict[str, float] = field(default_factory=dict)  # gateway -> expiry
    rooms: dict[str, dict[str, tuple[int, float]]] = field(default_factory=dict)
    served: dict[str, dict[str, Row]] = field(default_factory=dict)  # gateway id -> its rows
    operations: int = 0  # round trips served (a Redis store's would be one each)
    up: bool = True  # False: every call raises StoreDown (a test's dead store)

    def sync(self, it: SyncIn) -> SyncOut:
        now = self.answer()
        if it.epoch == self.epoch:
            for c, floor in it.lifts.items():
                self.counters[c] = max(self.counters.get(c, 0.0), floor)
            for c, amount in it.charges.items():
                self.counters[c] = self.counters.get(c, 0.0) + amount
        else:  # first contact, or the store lost its data: floors, never sums
            for c, value in it.counters.items():
                self.counters[c] = max(self.counters.get(c, -math.inf), value)
        self.waiting[it.gateway] = set(it.waiting)  # its latest snapshot
        self.gateways[it.gateway] = now + self.lease_s
        for backend, ids in it.bookings.items():
            room = self.rooms.setdefault(backend, {})
            room.update({i: (tokens, now + self.lease_s) for i, tokens in ids.items()})
        if it.served_as:  # (rows are whole values, written by their gateway only)
            self.served.setdefault(it.served_as, {}).update(it.served)
        self.gateways = {g: t for g, t in self.gateways.items() if t > now}
        waiting = {g: set(c) for g, c in self.waiting.items() if g in self.gateways}
        booked = {b: self.booked(b, now) for b in it.backends}
        served = {g: dict(rows) for g, rows in self.served.items()}
        counters = dict(self.counters)
        return SyncOut(self.epoch, counters, waiting, booked, len(self.gateways), served)

    def book(self, backend: str, booking: str, tokens: int, budget: int) -> tuple[bool, int]:
        """Reserve `tokens` if they fit; (booked?, the backend's booked tokens now)."""
        now = self.answer()
        total = self.booked(backend, now)
        if total + tokens > budget:
            return False, total
        self.rooms.setdefault(backend, {})[booking] = (tokens, now + self.lease_s)
        return True, total + tokens

    def booked_now(self, backends: list[str]) -> dict[str, int]:
        now = self.answer()
        return {b: self.booked(b, now) for b in backends}

    def release(self, backend: str, booking: str) -> None:
        self.answer()
        self.rooms.get(backend, {}).pop(booking, None)

    def answers(self) -> bool:
        return self.up

    def booked(self, backend: str, now: float) -> int:
        room = self.rooms.get(backend, {})
        for i in [i for i, (_, expiry) in room.items() if expiry <= now]:
            del room[i]  # an expired lease: its gateway is gone
        return sum(tokens for tokens, _ in room.values())

    def answer(self) -> float:
        if not self.up:
            raise StoreDown("the store is down")
        self.operations += 1
        return self.clock()


# --- which gateway served what -------------------------------------------------------------


class Served:
    """One gateway's rows: what its store holds for it (`base`) plus what it served since."""

    def __init__(self) -> None:
        self.base: dict[str, Row] = {}  # the store's row at our first sync (a restart's past)
        self.own: dict[str, Row] = {}  # served by this process
        self.sent: dict[str, Row] = {}  # what the store holds for us, as we last wrote it

    def record(self, client: str, prompt_tokens: int, output_tokens: int) -> None:
        """A request ended after a backend took it: served, for what it was charged."""
        r, i, o = self.own.get(client, (0, 0, 0))
        self.own[client] = (r + 1, i + prompt_tokens, o + output_tokens)

    def rows(self) -> dict[str, Row]:
        clients = self.base.keys() | self.own.keys()
        return {
            c: add_rows(self.base.get(c, (0, 0, 0)), self.own.get(c, (0, 0, 0))) for c in clients
        }

    def unsent(self) -> dict[str, Row]:
        """The rows the store does not hold as they are now."""
        return {c: row for c, row in self.rows().items() if self.sent.get(c) != row}

    def wrote(self, rows: dict[str, Row]) -> None:
        self.sent |= rows

    def first_seen(self, stored: dict[str, Row]) -> None:
        """Our first sync's answer: the store's row for our id (a restart's past) is the base
        we count on from; our own rows go in at the next sync."""
        self.base, self.sent = dict(stored), dict(stored)

    def store_lost(self) -> None:
        """The store came back empty (a new epoch): every row goes in again."""
        self.sent = {}


def add_rows(a: Row, b: Row) -> Row:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def as_json(rows: dict[str, Row]) -> dict[str, dict[str, int]]:
    """`/fairness`'s form of one gateway's rows."""
    keys = ("requests", "input_tokens", "output_tokens")
    return {c: dict(zip(keys, row, strict=True)) for c, row in sorted(rows.items())}
