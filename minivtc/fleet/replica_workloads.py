"""Workloads for a fleet: any trace scaled to N replicas, and two constructed to show where
per-replica counters fail (minivtc/fleet/README.md).

- `scaled(trace, n)`: n interleaved copies (copy k shifted by k/n of the mean gap between
  arrivals): the same clients, each sending n times as fast, so n replicas see what one saw.
  `minivtc simulate --replicas N` scales the paper's workloads so;
- "affinity": a tenant whose requests all share a system prompt ("system") and a flooding one
  with prompts of its own ("flood"), both above their fair share. Cache affinity sends every
  "system" request to one replica, so it gets one replica's worth at most while "flood" takes
  the rest of the fleet (flood's own prompts go to the least loaded, never that replica, whose
  queue only grows: at 4 and 8 replicas each replica serves one tenant, and its VTC has no one
  to weigh);
- "weighted": the same shape with operator weights 4:1 ("gold" with the shared system
  prompt, "free" flooding): per-replica counters keep 4:1 on gold's one replica only;
- "pair": a 4:1 weighted pair of equal-cost requests and nothing shared, the experiment of
  Dynamo's issue #15187 (two routers): `fleet/gateways.py` runs it through k gateways.

These two are generated at n times each rate (`FleetWorkload.make(n)`). Per replica the rates
are the overload workload's (Figure 3: 90 and 180 requests per minute of 256/256 overload one
A10G). Plain Python.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from minivtc.sim.workloads import WORKLOADS, TraceRequest, client_name, uniform

__all__ = ["FLEET_WORKLOADS", "fleet_workload", "scaled"]

SYSTEM_PROMPT_TOKENS = 128  # of each "system" request's 256 prompt tokens, shared


def scaled(trace: list[TraceRequest], n: int) -> list[TraceRequest]:
    """`trace` with n times the arrivals (the module docstring)."""
    if len(trace) < 2 or n == 1:
        return list(trace)
    period = (trace[-1].arrival_s - trace[0].arrival_s) / len(trace)
    copies = (replace(r, arrival_s=r.arrival_s + k * period / n) for r in trace for k in range(n))
    return sorted(copies, key=lambda r: r.arrival_s)


def shared_prompt(rates: list[float], duration: float, names: tuple[str, str]):
    """Two tenants, 256/256 ("uniform" arrivals): the first's requests all share one system
    prompt (a prefix_id that cache-aware routing follows), the second's prompts are its own."""
    first = client_name(0)
    return [
        replace(r, client=names[0], prefix_id="system", prefix_tokens=SYSTEM_PROMPT_TOKENS)
        if r.client == first
        else replace(r, client=names[1])
        for r in uniform(rates, duration)
    ]


@dataclass(frozen=True)
class FleetWorkload:
    """A constructed workload at n replicas' rates (`make(n)`), generated at n times each
    client's rate rather than by `scaled` copies: copies interleave in a fixed order that a
    round-robin router would alias with."""

    name: str
    make: Callable[[int], list[TraceRequest]]
    duration: float
    description: str
    weights: dict[str, float] | None = None


FLEET_WORKLOADS: dict[str, FleetWorkload] = {
    w.name: w
    for w in [
        FleetWorkload(
            "affinity",
            lambda n: shared_prompt([1.5 * n, 3.0 * n], 120, ("system", "flood")),
            120,
            "per replica: 'system' at 90 rpm sharing a system prompt, 'flood' at 180 rpm",
        ),
        FleetWorkload(
            "weighted",
            lambda n: shared_prompt([3.0 * n, 3.0 * n], 120, ("gold", "free")),
            120,
            "per replica: 'gold' (weight 4, a shared system prompt) and 'free' (weight 1), "
            "both at 180 rpm",
            weights={"gold": 4.0, "free": 1.0},
        ),
        FleetWorkload(
            "pair",
            lambda n: renamed(uniform([3.0 * n, 3.0 * n], 120), ("w4", "w1")),
            120,
            "per replica: 'w4' (weight 4) and 'w1' (weight 1), equal-cost 256/256 requests, "
            "both at 180 rpm: Dynamo's two-router experiment (issue #15187)",
            weights={"w4": 4.0, "w1": 1.0},
        ),
    ]
}


def renamed(trace: list[TraceRequest], names: tuple[str, str]) -> list[TraceRequest]:
    """Two tenants' trace with their clients named `names`."""
    first = client_name(0)
    return [replace(r, client=names[0] if r.client == first else names[1]) for r in trace]


def fleet_workload(name: str, n: int) -> tuple[list[TraceRequest], float, dict | None]:
    """(trace, horizon, weights) at n replicas: one of `FLEET_WORKLOADS`, or a paper workload
    (`sim/workloads.py`) `scaled` by n."""
    if name in FLEET_WORKLOADS:
        fleet = FLEET_WORKLOADS[name]
        return fleet.make(n), fleet.duration, fleet.weights
    if name in WORKLOADS:
        paper = WORKLOADS[name]
        return scaled(paper.make(), n), paper.duration, paper.weights
    names = ", ".join([*WORKLOADS, *FLEET_WORKLOADS])
    raise ValueError(f"unknown workload {name!r}; choose one of: {names}")
