"""Simulation: the real engine on a virtual clock, with a cost model in place of the model.

Owns: `VirtualClock`, `CostModelRunner` (the engine's runner interface, answering "how long
did this step take?" from the step's shape instead of running a forward pass), the cost models,
and `simulate()`, which replays a trace. The scheduler, admission, KV accounting and request
lifecycle are `engine.Engine`'s own code, unchanged: a simulation exercises exactly the policy
that serves real tokens. Arrivals are events; each engine step advances the clock by the cost
model's time for that step's batch. `progress_bar` is the bar long runs show on stderr (here,
in `report.py` and `calibrate.py`). Lessons 4-7 use it.

Cost models (`COST_MODELS`):
- `Roofline`: a step reads every weight once and each running request's K/V (memory time)
  and does 2 * params FLOPs per token (compute time); it takes the larger, plus a fixed
  per-step overhead. Presets for A10G/A100/H100/H200 use datasheet bandwidth and FLOP rates
  scaled by achievable fractions (documented per preset).
- `measured`: this machine running the bundled model, fitted by `minivtc calibrate`
  (`calibrate.py`), so a simulation of the tiny model can be set beside a real run of it.
- `a10g-llama7b`: the roofline form for Llama-2-7B fp16 on an A10G, its efficiencies and
  per-step overhead calibrated so the simulation reproduces the artifact's measured A10G runs
  (`data/a10g_runs`); `simulate(..., admit_every=10)` with `vtc-artifact` reproduces how the
  artifact admitted and charged (its deviations from Algorithm 2: no lift to the last client
  to leave, an uncharged first token, an extra charge at each finish, admission only every 10
  decode steps; lessons/artifact_deviations.md). The artifact's own profile
  (`data/a10g_cost_profile.json`) gives the relative cost h the paper charges with, but its
  absolute step times are far below what the measured runs achieved (29 ms vs ~570 ms per
  256/256 request), so it cannot time a step.
"""

from __future__ import annotations

import functools
import gc
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from tqdm import tqdm

from minivtc.engine import Engine
from minivtc.kv_pool import BlockAllocator
from minivtc.metrics import Served
from minivtc.policies import make_scheduler
from minivtc.request import Request
from minivtc.sampler import SamplingParams
from minivtc.scheduler import Scheduler
from minivtc.workloads import TraceRequest

SIM_TOKEN = 3  # the token every simulated step "generates"; EOS is ignored, as in the paper


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class StepShape:
    """What a cost model needs to know about one engine step."""

    prefill_tokens: int  # prompt tokens computed (newly admitted requests)
    num_requests: int  # requests in the batch (each gets one token)
    context_tokens: int  # K/V tokens attention reads, summed over the batch

    @classmethod
    def of(cls, requests: list[Request]) -> StepShape:
        """The shape of the step that runs `requests` (newly admitted ones prefill)."""
        prefill = context = 0
        for r in requests:  # one pass: this runs every simulated step
            n = len(r.prompt_ids) + len(r.output_ids)  # (not num_tokens: see Engine.append)
            context += n
            if r.num_computed == 0:  # newly admitted: its whole prompt is computed now
                prefill += n
        return cls(prefill, len(requests), context)


@dataclass(frozen=True)
class Roofline:
    """time = overhead + max(FLOPs / flop_rate, bytes / bandwidth) for one step."""

    name: str
    num_params: float  # model parameters
    weight_bytes: float
    kv_bytes_per_token: float
    bandwidth: float  # achievable bytes/s
    flop_rate: float  # achievable FLOP/s
    overhead_s: float  # fixed cost of a step: launches, scheduling, sampling, Python
    note: str = ""

    def step_time(self, step: StepShape) -> float:
        tokens = step.prefill_tokens + step.num_requests  # prompts, plus one token per request
        compute = 2 * self.num_params * tokens / self.flop_rate
        memory = (
            self.weight_bytes + self.kv_bytes_per_token * step.context_tokens
        ) / self.bandwidth
        return self.overhead_s + max(compute, memory)


def llama_roofline(name, n_params, n_layers, dim, dtype_bytes, bandwidth, flops, overhead, note=""):
    return Roofline(name, n_params, n_params * dtype_bytes, 2 * n_layers * dim * dtype_bytes,
                    bandwidth, flops, overhead, note)  # fmt: skip


# Datasheet bandwidth and dense fp16/bf16 rate, times achievable fractions (0.8 of bandwidth,
# 0.6 of peak FLOPs: what well-tuned kernels reach), plus 5 ms of per-step host overhead;
# these other presets are first-principles estimates, not calibrated.
COST_MODELS: dict[str, Roofline] = {
    m.name: m
    for m in [
        # A10G: 600 GB/s, 125 TFLOP/s fp16. The fractions (0.72, 0.5) and the 2 ms per step were
        # chosen so the artifact's measured VTC/FCFS runs on the real trace and the 256/256
        # overload are reproduced (`minivtc reproduce --only validate` prints the comparison).
        llama_roofline("a10g-llama7b", 6.74e9, 32, 4096, 2, 600e9 * 0.72, 125e12 * 0.5, 0.002,
                       "calibrated on the artifact's A10G runs (data/a10g_runs)"),
        llama_roofline("a100-llama13b", 13.0e9, 40, 5120, 2, 2.0e12 * 0.8, 312e12 * 0.6, 0.005),
        llama_roofline("h100-llama7b", 6.74e9, 32, 4096, 2, 3.35e12 * 0.8, 990e12 * 0.6, 0.005),
        llama_roofline("h200-llama7b", 6.74e9, 32, 4096, 2, 4.8e12 * 0.8, 990e12 * 0.6, 0.005),
    ]
}  # fmt: skip


class CostModel(Protocol):
    def step_time(self, step: StepShape) -> float: ...


def cost_model_named(name: str) -> CostModel:
    """A preset by name; "measured" (this machine, from `minivtc calibrate`); or a JSON path."""
    from minivtc.calibrate import DEFAULT_PATH, MeasuredCost

    if name in COST_MODELS:
        return COST_MODELS[name]
    if name == "measured":
        return MeasuredCost.load(DEFAULT_PATH)
    if name.endswith(".json"):
        return MeasuredCost.load(name)
    raise ValueError(
        f"unknown cost model {name!r}: choose one of {', '.join(COST_MODELS)}, 'measured', "
        "or a .json file written by `minivtc calibrate`"
    )


class CostModelRunner:
    """The engine's runner, simulated: advance the clock by the step's modelled time."""

    def __init__(self, cost_model: CostModel, clock: VirtualClock) -> None:
        self.cost_model, self.clock = cost_model, clock

    def run(self, requests: list[Request], allocator: BlockAllocator) -> list[int]:
        self.clock.now += self.cost_model.step_time(StepShape.of(requests))
        return [SIM_TOKEN] * len(requests)

    def release(self, request: Request) -> None:
        pass


@dataclass
class SimResult:
    served: list[Served]
    rejected: list[TraceRequest]
    total_time: float  # first arrival to last completion, in simulated seconds
    wall_s: float  # real seconds the simulation took
    steps: int
    counters: dict[str, float] = field(default_factory=dict)  # final VTC counters, if any


def simulate(
    trace: Iterable[TraceRequest],
    scheduler: str | Scheduler = "vtc",
    cost_model: str | CostModel = "a10g-llama7b",
    kv_tokens: int = 10000,
    block_size: int = 1,
    weights: dict[str, float] | None = None,
    seed: int = 0,
    check_fairness: bool = False,
    reservation: str = "peak",
    admit_every: int = 1,
    progress: bool = False,
) -> SimResult:
    """Replay `trace` through the engine on a virtual clock; every request's client-side record."""
    trace = sorted(trace, key=lambda r: r.arrival_s)
    model = cost_model_named(cost_model) if isinstance(cost_model, str) else cost_model
    policy = (
        make_scheduler(scheduler, weights=weights, seed=seed)
        if isinstance(scheduler, str)
        else scheduler
    )
    clock = VirtualClock()
    runner = CostModelRunner(model, clock)
    engine = Engine(runner, BlockAllocator(-(-kv_tokens // block_size), block_size), policy,
                    max_positions=1 << 30, eos_id=-1, clock=clock, max_running=1 << 30,
                    check_fairness=check_fairness, reservation=reservation,
                    admit_every=admit_every)  # fmt: skip
    start = time.perf_counter()
    with gc_paused():
        served, rejected, steps = replay(engine, clock, trace, progress)
    first = trace[0].arrival_s if trace else 0.0
    total = max((s.end_s for s in served), default=first) - first
    counters = {c: n for c, (n, _) in policy.accounts().items() if n is not None}
    return SimResult(served, rejected, total, time.perf_counter() - start, steps, counters)


def replay(
    engine: Engine, clock: VirtualClock, trace: list[TraceRequest], progress: bool
) -> tuple[list[Served], list[TraceRequest], int]:
    """Add each arrival once the clock reaches it, step the engine, record requests as they end.

    Returns the served records, the rejected arrivals and the number of steps."""
    # One prompt list and one SamplingParams per length, shared: 1M requests stay small.
    prompt_of = functools.cache(lambda n: [1] * n)
    params_of = functools.cache(lambda n: SamplingParams(max_tokens=n, ignore_eos=True))
    live: dict[str, tuple[Request, TraceRequest]] = {}
    served, rejected, steps, i, shown = [], [], 0, 0, 0
    bar = progress_bar(len(trace), "simulating", "req", progress)
    while i < len(trace) or engine.has_unfinished():
        while i < len(trace) and trace[i].arrival_s <= clock.now:
            t = trace[i]
            i += 1
            try:
                r = engine.add_request(prompt_of(t.input_tokens), params_of(t.output_tokens),
                                       client_id=t.client, arrival_time=t.arrival_s)  # fmt: skip
                live[r.request_id] = (r, t)
            except ValueError:
                rejected.append(t)
        if not engine.has_unfinished():
            if i == len(trace):
                break  # the last arrivals were all rejected
            clock.now = max(clock.now, trace[i].arrival_s)
            continue
        for r in engine.step():
            if r.finish_reason is not None:
                served.append(record(*live.pop(r.request_id)))
        steps += 1
        # Progress by requests done, not arrived (an overloaded trace drains long after its last
        # arrival). The bar is touched only when the percentage moves: the loop runs millions
        # of steps.
        if progress and (done := len(served) + len(rejected)) * 100 // len(trace) > shown:
            shown = done * 100 // len(trace)
            bar.set_postfix_str(f"{i} arrived, t = {clock.now:.0f} s", refresh=False)
            bar.update(done - bar.n)
    if progress:
        bar.update(len(served) + len(rejected) - bar.n)
        bar.close()
    return served, rejected, steps


def progress_bar(total: float, desc: str, unit: str, enabled: bool = True) -> tqdm:
    """A tqdm bar on stderr, or a silent one when not `enabled`. On a terminal it redraws in
    place; in a log or CI, where every redraw lengthens one line, it redraws every 30 s."""
    interval = 0.1 if sys.stderr.isatty() else 30.0
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not enabled,
                mininterval=interval, leave=None, dynamic_ncols=True)  # fmt: skip


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a while (process-wide). A simulation makes
    millions of small objects and no reference cycles; with a million requests waiting, every
    full collection walks them all, which cost 15-20% of a long simulation."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def record(request: Request, t: TraceRequest) -> Served:
    ttft, latency = request.first_token_time - t.arrival_s, request.finish_time - t.arrival_s
    return Served(t.client, t.arrival_s, t.input_tokens, t.output_tokens, ttft, latency)
