"""N replicas on one virtual clock: real `Engine`s behind the fair dispatcher, or behind the
field's routers with a scheduler per replica.

Owns `simulate_fleet()`. Each replica is a real `Engine` (with its own step-time model and its
own clock: the time its current step ends), exactly as `sim/simulator.py` runs one. Events are
handled in time order: the next arrival, or the replica whose step ends first. Two ways to run:

- `routing="global"`: the `Dispatcher` holds every client's queue and counter; a request is
  bound to a replica only when that replica has room (full reservation), so each replica's own
  scheduler (FCFS) admits it at its next step and never queues. `route_by` picks among the
  replicas with room ("least-loaded", or "prefix": where the prompt's prefix ran last);
- `routing="round-robin" | "least-loaded" | "random" | "prefix"`: the field's practice. Each
  arrival goes at once to a replica chosen from all of them ("prefix": cache affinity, the
  replica that served the prefix first, however loaded), which queues it behind its own
  `scheduler` with its own counters.

The dispatcher binds at the event that makes room (an arrival, a step's end) and the replica
admits at its next step, as a backend behind an HTTP gateway would; with one replica that is
exactly the single engine's run (a test checks it). The service gap is measured over the
fleet (`FleetWatch`, `sim/backlog.py`). Plain Python. minivtc/fleet/README.md; Lesson 14.
"""

from __future__ import annotations

import functools
import heapq
import math
import time
from dataclasses import dataclass, replace
from typing import Any, cast

from minivtc.engine.engine import Engine
from minivtc.engine.engine_config import EngineConfig
from minivtc.engine.kv_pool import BlockAllocator
from minivtc.fairness.cost import W_Q
from minivtc.fairness.scheduler import FCFS
from minivtc.fleet.backend import Backend, make_route
from minivtc.fleet.dispatcher import Dispatcher, News
from minivtc.fleet.gateways import Gateways, GatewaySpec
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request
from minivtc.sim.backlog import FleetWatch
from minivtc.sim.metrics import Served
from minivtc.sim.simulator import (
    SIM_EOS,
    SimResult,
    StepTimeRunner,
    VirtualClock,
    gc_paused,
    record,
)
from minivtc.sim.step_time import step_time_model
from minivtc.sim.workloads import TraceRequest

__all__ = ["FleetResult", "ROUTINGS", "simulate_fleet"]

FLEET = EngineConfig(block_size=1)  # a replica's pool is token-granular, as the paper's
CHOSEN = ("policy", "kv_tokens", "weights", "seed", "check_fairness")  # what a caller may choose
ROUTINGS = ("global", "round-robin", "least-loaded", "random", "prefix")


@dataclass
class FleetResult:
    result: SimResult  # the fleet as one: every request, the counters, the bound, the gap
    replicas: list[int]  # the replica each of `result.served` ran on, in the same order
    num_replicas: int


@dataclass
class Replica:
    engine: Engine
    clock: VirtualClock
    backend: Backend
    busy: bool = False  # it has work: its next step is on the event heap


def simulate_fleet(
    trace: list[TraceRequest],
    num_replicas: int,
    routing: str | GatewaySpec = "global",
    route_by: str = "least-loaded",
    scheduler: str | EngineConfig = "vtc",
    step_time: str = "a10g-llama7b",
    *,
    watch_backlog: bool = False,
    staleness: float = 0.0,
    **config: Any,
) -> FleetResult:
    """Replay `trace` on `num_replicas` replicas of `kv_tokens` each (the module docstring).
    `scheduler`: an `EngineConfig`, or a policy name with its keywords (`fleet_config`:
    kv_tokens, weights, seed, check_fairness). `staleness` (global): the dispatcher hears of
    each step that many seconds after it ends. `routing` a `GatewaySpec`: k gateways in front of
    the replicas, each a global dispatcher of its own, sharing a store or not (`gateways.py`)."""
    gateways = routing if isinstance(routing, GatewaySpec) else None
    routing = "global" if gateways else routing
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    if route_by not in ("least-loaded", "prefix"):
        raise ValueError(f"route_by must be 'least-loaded' or 'prefix', got {route_by!r}")
    if num_replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {num_replicas}")
    engine_config = fleet_config(scheduler, config)
    fleet = Fleet(num_replicas, routing, route_by, engine_config, step_time)
    check_fairness, weights = engine_config.check_fairness, engine_config.weights
    if gateways is not None:
        if staleness:
            raise ValueError("with gateways, the view's staleness is their sync interval")
        budgets = [(b.name, b.budget) for b in fleet.backends()]
        clock = lambda: fleet.now  # noqa: E731  (the virtual clock: the store's and the syncs')
        fleet.dispatcher = Gateways.of(gateways, budgets, engine_config, route_by, clock)
    elif routing == "global":
        policy = engine_config.scheduler()
        fleet.dispatcher = Dispatcher(policy, fleet.backends(), fleet.route, check_fairness)
        fleet.news = News(staleness) if staleness else None
    elif staleness:
        raise ValueError("staleness is the global dispatcher's view: only with routing 'global'")
    fleet.watch = FleetWatch(None if weights is None else dict(weights)) if watch_backlog else None
    start = time.perf_counter()
    with gc_paused():  # PERF: as `simulate`: millions of objects, no cycles
        fleet.run(sorted(trace, key=lambda r: r.arrival_s))
    return fleet.result(trace, time.perf_counter() - start)


def fleet_config(scheduler: str | EngineConfig, keywords: dict[str, Any]) -> EngineConfig:
    """`simulate_fleet`'s config: each replica reserves prompt + max_tokens (full reservation,
    the course's proof condition) in a token-granular pool of `kv_tokens`; only the fields in
    `CHOSEN` may be chosen (check_fairness is the dispatcher's, routing "global")."""
    keywords = keywords if isinstance(scheduler, EngineConfig) else {"block_size": 1} | keywords
    config = EngineConfig.of(scheduler, **keywords)
    if not isinstance(config.policy, str):
        raise TypeError("simulate_fleet takes a policy name: one policy object per replica")
    if replace(config, **{name: getattr(FLEET, name) for name in CHOSEN}) != FLEET:
        raise ValueError(
            "simulate_fleet: each replica reserves prompt + max_tokens in a token-granular "
            "pool of kv_tokens; of the rest only weights, seed and check_fairness are chosen"
        )
    return config


class Fleet:
    """The replicas, the dispatcher (global) or routes (per replica), and the event loop."""

    def __init__(self, n, routing, route_by, config, step_time):
        # (per replica, the config's policy runs on every engine; global, on the dispatcher)
        kv_tokens = config.pool_tokens
        model = step_time_model(step_time)
        replica = EngineConfig(reservation="full", max_running=1 << 30)
        self.replicas = []
        for k in range(n):
            clock = VirtualClock()
            policy = FCFS() if routing == "global" else config.scheduler()
            engine = Engine(
                StepTimeRunner(model, clock),
                BlockAllocator(kv_tokens, 1),
                policy,
                max_positions=1 << 30,
                eos_id=SIM_EOS,
                clock=clock,
                config=replica,
            )
            self.replicas.append(Replica(engine, clock, Backend(f"replica-{k}", kv_tokens)))
        self.index = {r.backend.name: k for k, r in enumerate(self.replicas)}
        self.route = make_route(route_by if routing == "global" else routing, config.seed)
        self.dispatcher: Dispatcher | Gateways | None = None  # routing "global" (`simulate_fleet`)
        self.watch: FleetWatch | None = None
        self.heap: list[tuple[float, int]] = []  # (when its step ends, replica) for busy ones
        self.now, self.steps = 0.0, 0
        self.news: News | None = None  # a stale view (`simulate_fleet`'s staleness)
        self.arrivals: dict[str, TraceRequest] = {}  # request id -> its trace record, until done
        self.ran_on: dict[str, int] = {}  # request id -> the replica it was sent to
        self.served: list[tuple[Served, int]] = []
        self.rejected: list[TraceRequest] = []

    def run(self, trace: list[TraceRequest]) -> None:
        """Events in time order: an arrival at or before the next step's end comes first."""
        i, prefixes = 0, dict[str, list[int]]()
        while i < len(trace) or self.heap or (self.news and self.news.queue):
            next_arrival = trace[i].arrival_s if i < len(trace) else math.inf
            next_step = self.heap[0][0] if self.heap else math.inf
            before = self.watch.waiting() if self.watch else frozenset()
            service: dict[str, float] = {}
            heard = self.news.next_time if self.news else None
            if heard is not None and heard <= min(next_arrival, next_step):
                self.now = heard
                self.hear()
            elif next_step < next_arrival:
                self.now, k = heapq.heappop(self.heap)
                service = self.step(k)
            else:
                self.now = next_arrival
                self.arrive(trace[i], i, prefixes)
                i += 1
            if self.dispatcher is not None:
                self.bind()
            if self.watch:
                self.watch.event(before, service)

    def arrive(self, t: TraceRequest, i: int, prefixes: dict) -> None:
        request = make_request(t, i, prefixes)
        if self.dispatcher is not None:
            reason = self.dispatcher.add(request, t.arrival_s)
        else:  # the field's practice: a replica now, from all of them
            backend = self.route.choose(request, self.backends())
            reason = self.send(request, backend)
            self.route.served(request, backend)
        if reason is not None:
            self.rejected.append(t)
            return
        self.arrivals[request.request_id] = t
        if self.watch:
            self.watch.joined(t.client)

    def backends(self) -> list[Backend]:
        return [r.backend for r in self.replicas]

    def bind(self) -> None:
        """The dispatcher's admission round; each bound request joins its replica now."""
        assert self.dispatcher is not None, "routing 'global' only"
        for request, backend in self.dispatcher.bind():
            self.send(request, backend)
            if self.watch:
                self.watch.left(request.client_id)

    def send(self, request: Request, backend: Backend) -> str | None:
        """`request` joins `backend`'s engine; an idle replica's clock catches up to now."""
        k = self.index[backend.name]
        replica = self.replicas[k]
        engine = replica.engine
        try:
            engine.add_request(
                request.prompt_ids,
                request.params,
                request.client_id,
                request.request_id,
                arrival_time=self.now,
            )
        except ValueError as e:
            return str(e)
        if self.dispatcher is None:
            backend.reserve(request)  # its load, for least-loaded routing (no budget kept)
        self.ran_on[request.request_id] = k
        if not replica.busy:
            replica.clock.now = max(replica.clock.now, self.now)
            replica.busy = True
            heapq.heappush(self.heap, (replica.clock.now, k))
        return None

    def step(self, k: int) -> dict[str, float]:
        """Replica `k`'s step; returns each client's service in it (for the watch)."""
        replica = self.replicas[k]
        batch = replica.engine.step()
        self.steps += 1
        if self.news is not None:  # the dispatcher hears of it `staleness` seconds later
            self.news.post(replica.clock.now, batch)
        elif self.dispatcher is not None:
            self.dispatcher.on_decode(batch)
        service = self.measure(batch) if self.watch else {}
        for request in batch:
            if request.finish_reason is not None:
                self.finish(request, k)
        if batch and replica.engine.has_unfinished():
            heapq.heappush(self.heap, (replica.clock.now, k))
        else:
            replica.busy = False
        return service

    def measure(self, batch: list[Request]) -> dict[str, float]:
        """Each client's service in a step: its tokens processed (a first token: the prompt
        too, prefilled in this step). Per replica, that is also when it stopped waiting."""
        service: dict[str, float] = {}
        assert self.watch is not None, "measured only with a watch"
        for r in batch:
            first = len(r.output_ids) == 1
            price = self.watch.price(r.num_prompt if first else 0, 1, r.client_id)
            service[r.client_id] = service.get(r.client_id, 0.0) + price
            if first and self.dispatcher is None:
                self.watch.left(r.client_id)
        return service

    def finish(self, request: Request, k: int) -> None:
        t = self.arrivals.pop(request.request_id)
        if self.news is not None:
            pass  # its room is freed when the dispatcher hears of it (`hear`)
        elif self.dispatcher is not None:
            self.dispatcher.on_finish(request)
        else:
            backend = self.replicas[k].backend
            backend.release(request.request_id)
            backend.served += 1
        self.served.append((record(request, t), k))

    def hear(self) -> None:
        """The news due now reaches the dispatcher: tokens charged, finished rooms freed."""
        assert self.news is not None and self.dispatcher is not None, "a stale global view"
        for seen, done in self.news.due(self.now):
            # a Seen is what on_decode reads of a request (`staleness.Seen`)
            self.dispatcher.on_decode(cast("list[Request]", seen))
            for request in done:
                self.dispatcher.on_finish(request)

    def bound(self) -> float | None:
        """2U; with a stale view, 2U + 2 w_q G in counter units (`News`, `dispatcher.py`)."""
        bound = self.dispatcher.gap_bound() if self.dispatcher else None
        if bound is None or self.news is None:
            return bound
        check = self.dispatcher.fairness if isinstance(self.dispatcher, Dispatcher) else None
        assert check is not None, "a bound is stated only where it is checked"
        return bound + 2 * W_Q * self.news.most_unseen * check.scale

    def result(self, trace: list[TraceRequest], wall_s: float) -> FleetResult:
        served = [s for s, _ in self.served]
        first = min((t.arrival_s for t in trace), default=0.0)
        policy = self.dispatcher.scheduler if self.dispatcher else None
        sim = SimResult(
            served=served,
            rejected=self.rejected,
            total_time=max((s.end_s for s in served), default=first) - first,
            wall_s=wall_s,
            steps=self.steps,
            counters=policy.ledger.counters() if policy else {},
            bound=self.bound(),
            backlogged_gap=self.watch.worst if self.watch else None,
        )
        return FleetResult(sim, [k for _, k in self.served], len(self.replicas))


def make_request(t: TraceRequest, i: int, prefixes: dict) -> Request:
    """Trace request number `i` as the dispatcher sees it: its prompt's first tokens are its
    prefix's (one token id per `prefix_id`), or a token of its own (a prefix nobody shares)."""
    token = -1 - i if t.prefix_id is None else prefixes.setdefault(t.prefix_id, len(prefixes))
    shared = max(t.prefix_tokens, 1)
    prompt = [token] * min(shared, t.input_tokens) + [1] * (t.input_tokens - shared)
    return Request(f"r{i}", t.client, prompt, params_of(t.output_tokens), t.arrival_s)


@functools.cache
def params_of(max_tokens: int) -> SamplingParams:
    """One SamplingParams per length, shared (as `sim.replay`'s): a request runs to its
    trace's output_tokens. (A trace's max_tokens above it is not modelled here.)"""
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)
