"""Where a request runs: the choice of backend, separate from the choice of request.

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

from minivtc.fleet.backend import Backend
from minivtc.requests.request import Request

__all__ = ["LeastLoaded", "PrefixAware", "RoundRobin", "Route", "make_route", "prompt_prefix"]

PREFIX_TOKENS = 16  # a prompt's first 16 tokens name its prefix (one KV block of 16)


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
