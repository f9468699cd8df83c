"""k gateways in front of the same simulated replicas: `minivtc simulate --replicas N
--gateways k --sync TAU` (with the shared store) or `--no-store` (each gateway on its own).

Owns `Gateways`: k `Dispatcher`s, each with its own policy object and its own view of every
replica's room (`Backend`s of its own), which the fleet simulator (`replicas.py`) drives as it
drives one dispatcher. With a store, each is a `fleet_member.Member` of one `MemoryStore` on the
virtual clock, syncing every TAU seconds (at the first event after each sync is due: nothing
is decided between events), so the code under test is the gateway's own. Without one, each
gateway is a dispatcher alone on a 1/k slice of each replica's budget, with counters of its
own: Dynamo's routers, each with its own state. (Each believing it owns whole replicas, they
would over-book them, and the replicas' own queues would decide the order instead.)

`ingress`, which gateway an arrival reaches: "balanced" (each client's requests through the
gateways in turn), "skewed" (each client through
one gateway: the first client seen through gateway 0, the next through gateway 1, ...),
"swapped" (the reverse order). Delta, the bound's lag term (`fleet_member.py`), is measured
exactly here after every round that dispatched (the proof uses the views at dispatches): the
true counters are the store's plus what each gateway has not sent yet, less the gateway's
view (its own charges are in both). minivtc/fleet/README.md; Lesson 14.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from minivtc.engine.engine_config import EngineConfig
from minivtc.fairness.scheduler import Scheduler
from minivtc.fleet.backend import Backend, Route, make_route
from minivtc.fleet.dispatcher import Dispatcher
from minivtc.fleet.fleet_member import Member, fleet_bound
from minivtc.fleet.shared_store import MemoryStore, PolicyBooks
from minivtc.requests.request import Request

__all__ = ["GatewaySpec", "Gateways"]

INGRESS = ("balanced", "skewed", "swapped")


@dataclass(frozen=True)
class GatewaySpec:
    """k gateways in front of the replicas (`simulate_fleet`'s routing): `ingress`, and the
    store's `sync_s` (tau; None: no store, each gateway alone on its slice)."""

    k: int
    ingress: str = "balanced"
    sync_s: float | None = 0.05

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"gateways must be >= 1, got {self.k}")
        if self.ingress not in INGRESS:
            raise ValueError(f"ingress must be one of {', '.join(INGRESS)}, not {self.ingress!r}")
        if self.sync_s is not None and not self.sync_s >= 0:
            raise ValueError(f"the sync interval must be >= 0 seconds, got {self.sync_s}")


class Gateways:
    """`k` gateways, `budgets` the replicas' (name, tokens); `sync_s`: tau, None for no store."""

    def __init__(
        self,
        k: int,
        make_policy: Callable[[], Scheduler],
        budgets: list[tuple[str, int]],
        make_route: Callable[[], Route],
        ingress: str,
        sync_s: float | None,
        clock: Callable[[], float],
        weights: dict[str, float] | None = None,
    ) -> None:
        if k < 1:
            raise ValueError(f"gateways must be >= 1, got {k}")
        if ingress not in INGRESS:
            raise ValueError(f"ingress must be one of {', '.join(INGRESS)}, got {ingress!r}")
        self.ingress, self.clock = ingress, clock
        self.store = MemoryStore(clock, lease_s=math.inf) if sync_s is not None else None
        self.dispatchers: list[Dispatcher] = []
        self.members: list[Member] = []
        for g in range(k):
            # without a store, each gateway alone on a 1/k slice of each replica (never over-
            # booked: the gateways' order stays the only order, as Dynamo's routers keep theirs)
            share = 1 if self.store is not None else k
            backends = [Backend(name, tokens // share) for name, tokens in budgets]
            policy = make_policy()
            member = None
            if self.store is not None:
                assert sync_s is not None, "a store comes with its sync interval"
                books = PolicyBooks(policy)
                member = Member(f"gateway-{g}", self.store, books, backends, sync_s, clock)
                self.members.append(member)
            self.dispatchers.append(Dispatcher(policy, backends, make_route(), False, member))
        self.owner: dict[str, int] = {}  # request id -> the gateway it came through
        self.entry: dict[str, int] = {}  # client -> its gateway (skewed, swapped)
        self.turns: dict[str, int] = {}  # balanced: client -> its last request's gateway
        self.most_lag = 0.0  # Delta: the most a gateway's view lagged a true counter
        self.budgets, self.weights = [Backend(n, t) for n, t in budgets], dict(weights or {})

    @classmethod
    def of(cls, spec: GatewaySpec, budgets, engine: EngineConfig, route_by, clock):
        """`simulate_fleet`'s: each gateway's policy the engine config's, its route `route_by`."""
        k, ingress, sync_s = spec.k, spec.ingress, spec.sync_s
        weights = None if engine.weights is None else dict(engine.weights)
        route = lambda: make_route(route_by, engine.seed)  # noqa: E731
        return cls(k, engine.scheduler, budgets, route, ingress, sync_s, clock, weights)

    @property
    def scheduler(self) -> Scheduler:
        """Gateway 0's policy: with a store, its counters are the fleet's (as last synced)."""
        return self.dispatchers[0].scheduler

    def add(self, request: Request, now: float) -> str | None:
        g = self.gateway_for(request.client_id)
        d = self.dispatchers[g]
        if d.member is not None:
            reason = self.members[g].add(d, request, now)
        else:
            reason = d.add(request, now)
        if reason is None:
            self.owner[request.request_id] = g
        return reason

    def bind(self) -> list[tuple[Request, Backend]]:
        """Each gateway's round in turn, after its sync if one is due."""
        bound = []
        for g, d in enumerate(self.dispatchers):
            if self.members:
                member = self.members[g]
                if member.due(self.clock()) and member.sync():
                    d.wake()  # others released room: look again
            now = d.bind()
            if now and self.members:
                self.measure_lag(g)  # the proof uses the views at dispatches only
            bound += now
        return bound

    def on_decode(self, requests: list[Request]) -> None:
        by_gateway: dict[int, list[Request]] = {}
        for r in requests:
            by_gateway.setdefault(self.owner[r.request_id], []).append(r)
        for g, batch in by_gateway.items():
            self.dispatchers[g].on_decode(batch)

    def on_finish(self, request: Request) -> Backend:
        g = self.owner.pop(request.request_id)
        backend = self.dispatchers[g].on_finish(request)
        if self.members:
            self.members[g].release(backend, request)
        return backend

    def gap_bound(self) -> float | None:
        """2U + 2 Delta + 2S in counter units, with the store (`fleet_member.py`: S the
        largest slack a gateway used); without one, none is claimed."""
        if self.store is None:
            return None
        slack = max(m.most_lag for m in self.members)  # (each slack is a lag a sync revealed)
        return fleet_bound(self.budgets, self.weights, self.most_lag, slack)

    def measure_lag(self, g: int) -> None:
        """Delta at gateway g now: the true counters (the store's plus every gateway's unsent
        charges) less g's view of them."""
        assert self.store is not None, "measured with a store"
        true = dict(self.store.counters)
        unsent = [member.unsent() for member in self.members]
        for _, _, lifts in unsent:
            for c, floor in lifts.items():
                true[c] = max(true.get(c, 0.0), floor)
        for _, charges, _ in unsent:
            for c, amount in charges.items():
                true[c] = true.get(c, 0.0) + amount
        view = self.members[g].books
        for c, v in true.items():
            seen = view.counter(c)
            if seen is not None:
                self.most_lag = max(self.most_lag, v - seen)

    def gateway_for(self, client: str) -> int:
        k = len(self.dispatchers)
        if self.ingress == "balanced":  # each client's own turns (theirs could alias)
            self.turns[client] = self.turns.get(client, -1) + 1
            return self.turns[client] % k
        if client not in self.entry:
            n = len(self.entry)
            self.entry[client] = n % k if self.ingress == "skewed" else (k - 1 - n) % k
        return self.entry[client]
