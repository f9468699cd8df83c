"""Backends and routes: a backend's room as the dispatcher sees it, and where a request runs, the
choice of backend, separate from the choice of request (`dispatcher.py`).

Owns `Backend`: the capacity model of one replica. Its budget is the KV tokens it serves (for
a minivtc backend its `--kv-tokens`); each request bound to it reserves `prompt + max_tokens`
(full reservation, the course's proof condition for Lemma 4.3) until it finishes, so a
request bound only where it fits is admitted by the backend at once: backends never queue,
and the dispatcher's order is the only order. Also where the request is (`requests`) and
whether the backend may take work (`healthy`).

Owns the routes. `choose(request, candidates)` picks one of `candidates`, or None for none;
`served(request, backend)` tells the route where it went. The fair dispatcher passes only the
backends with room for the request (`Backend.fits`): VTC has already decided *who* is next,
the route only decides *where*, and no route changes a counter, so none changes the bound
(`dispatcher.py`). The field's routers (llm-d, AIBrix, Dynamo, SGLang's) pick a replica at
arrival from all of them, each replica queueing behind its own scheduler: the simulator's
baselines (`replicas.py`) pass every backend.

- `LeastLoaded`: the smallest share of its budget reserved (the dispatcher's default);
- `PrefixAware`: the backend that last served the request's prompt prefix (its KV may still
  be cached there), else least-loaded. Given every backend it is cache affinity: a prefix
  stays on its replica however loaded;
- `RoundRobin`, `Random`: the field's load-blind baselines.

Plain Python. minivtc/fleet/README.md; Lesson 14.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from minivtc.requests.request import Request

__all__ = ["Backend", "LeastLoaded", "PrefixAware", "RoundRobin", "Route", "make_route"]
__all__ += ["prompt_prefix"]

PREFIX_TOKENS = 16  # a prompt's first 16 tokens name its prefix (one KV block of 16)


@dataclass(eq=False)  # a backend is itself, not its numbers: two empty ones are not equal
class Backend:
    """`name`: how logs and metrics call it (a URL, "replica-3"); `budget`: its KV tokens."""

    name: str
    budget: int
    reserved: int = 0  # tokens reserved by the requests bound to it
    healthy: bool = True  # False: skipped until a health check says otherwise
    requests: dict[str, int] = field(default_factory=dict)  # request id -> tokens reserved
    served: int = 0  # requests it finished (a fleet's per-replica table)
    elsewhere: int = 0  # tokens other gateways booked on it (a shared store's view: `fleet_member`)

    def __post_init__(self) -> None:
        if self.budget < 2:
            raise ValueError(
                f"backend {self.name!r}: budget must be >= 2 tokens, got {self.budget}"
            )

    def fits(self, request: Request) -> bool:
        """Full reservation: `request` may run here to its max_tokens without running out."""
        return self.reserved + self.elsewhere + request.max_num_tokens <= self.budget

    def reserve(self, request: Request) -> None:
        assert request.request_id not in self.requests, f"{request.request_id} bound twice"
        self.requests[request.request_id] = request.max_num_tokens
        self.reserved += request.max_num_tokens

    def release(self, request_id: str) -> None:
        """`request_id` finished, failed or was given back: its reservation is free again."""
        self.reserved -= self.requests.pop(request_id)

    @property
    def load(self) -> float:
        """The share of the budget reserved: least-loaded routing compares it."""
        return (self.reserved + self.elsewhere) / self.budget

    def check_invariants(self) -> None:
        assert self.reserved == sum(self.requests.values()), (
            f"backend {self.name!r}: reserved {self.reserved} != its requests' "
            f"{sum(self.requests.values())}"
        )
        assert 0 <= self.reserved, f"backend {self.name!r}: reserved {self.reserved} < 0"


def prompt_prefix(request: Request) -> Hashable:
    """The prefix key: the prompt's first `PREFIX_TOKENS` token ids."""
    return tuple(request.prompt_ids[:PREFIX_TOKENS])


class Route:
    name = "route"

    def choose(self, request: Request, candidates: list[Backend]) -> Backend | None:
        raise NotImplementedError

    def served(self, request: Request, backend: Backend) -> None:
        pass


class LeastLoaded(Route):
    """The backend with the smallest share of its budget reserved; ties to the first."""

    name = "least-loaded"

    def choose(self, request: Request, candidates: list[Backend]) -> Backend | None:
        return min(candidates, key=lambda b: b.load, default=None)


class PrefixAware(LeastLoaded):
    """The candidate that last served the request's prefix, else the least loaded. A counter
    never sees where a request ran: the bound is unchanged (`dispatcher.py`)."""

    name = "prefix"

    def __init__(self, key: Callable[[Request], Hashable] = prompt_prefix) -> None:
        self.key = key
        self.last: dict[Hashable, Backend] = {}  # prefix -> the backend that served it last

    def choose(self, request: Request, candidates: list[Backend]) -> Backend | None:
        home = self.last.get(self.key(request))
        if home is not None and home in candidates:
            return home
        return super().choose(request, candidates)

    def served(self, request: Request, backend: Backend) -> None:
        self.last[self.key(request)] = backend


class RoundRobin(Route):
    name = "round-robin"

    def __init__(self) -> None:
        self.turn = 0

    def choose(self, request: Request, candidates: list[Backend]) -> Backend | None:
        if not candidates:
            return None
        self.turn += 1
        return candidates[(self.turn - 1) % len(candidates)]


class Random(Route):
    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def choose(self, request: Request, candidates: list[Backend]) -> Backend | None:
        return self.rng.choice(candidates) if candidates else None


def make_route(name: str, seed: int = 0) -> Route:
    """A route from its command-line name."""
    routes = {"least-loaded": LeastLoaded, "prefix": PrefixAware, "round-robin": RoundRobin}
    if name == "random":
        return Random(seed)
    if name not in routes:
        raise ValueError(f"unknown route {name!r}; choose one of: {', '.join([*routes, 'random'])}")
    return routes[name]()
