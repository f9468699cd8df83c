"""Simulation: the real engine on a virtual clock, with a step-time model in place of the model.

Owns: `VirtualClock`, `StepTimeRunner` (the engine's runner interface, answering "how long did
this step take?" from the step's shape instead of running a forward pass, `step_time.py`), and
`simulate()`, which replays a trace. The scheduler, admission, KV accounting and request
lifecycle are `engine.Engine`'s own code, unchanged: a simulation exercises exactly the policy
that serves real tokens. Arrivals are events; each engine step advances the clock by the
step-time model's time for that step's batch. `simulate(..., admit_every=10)` with
`vtc-artifact` reproduces how the official artifact admitted and charged
(lessons/artifact_deviations.md). `progress_bar` is the bar long runs show on stderr (here, in
`report.py` and `calibrate.py`). Nothing here touches tensors: importing it imports no torch.
Lessons 4-8 use it.
"""

from __future__ import annotations

import functools
import gc
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tqdm import tqdm

from minivtc.engine.engine import Engine, engine_stats
from minivtc.engine.engine_config import EngineConfig
from minivtc.engine.kv_pool import BlockAllocator
from minivtc.fairness.scheduler import Scheduler
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request
from minivtc.sim.backlog import BacklogWatch
from minivtc.sim.metrics import Served
from minivtc.sim.step_time import (
    SWAP_S_PER_TOKEN,
    StepShape,
    StepTimeModel,
    step_time_model,
)
from minivtc.sim.workloads import TraceRequest

__all__ = ["Engine", "SIM_EOS", "SimResult", "StepTimeRunner", "VirtualClock", "gc_paused"]
__all__ += ["progress_bar", "record", "replay", "simulate"]

DEFAULT_RUNNING = EngineConfig().max_running
SIM_TOKEN = 3  # the token every simulated step "generates"
SIM_EOS = 2  # what it generates as a request's last, where the trace says it ends (max_tokens)


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class StepTimeRunner:
    """The engine's runner, simulated: advance the clock by the step's modelled time."""

    def __init__(
        self,
        step_time: StepTimeModel,
        clock: VirtualClock,
        swap_s_per_token: float = SWAP_S_PER_TOKEN,
    ) -> None:
        self.step_time, self.clock, self.swap_s_per_token = step_time, clock, swap_s_per_token
        # Requests with a limit above their length: request id -> the output length at which
        # they end (with EOS). Others run to max_tokens with EOS ignored, as in the paper.
        self.ends: dict[str, int] = {}

    def run(self, requests: list[Request], allocator: BlockAllocator) -> list[int]:
        self.clock.now += self.step_time.step_time(StepShape.of(requests))
        if not self.ends:  # (the paper's traces)
            return [SIM_TOKEN] * len(requests)
        ends = self.ends
        return [
            SIM_EOS if ends.get(r.request_id) == len(r.output_ids) + 1 else SIM_TOKEN
            for r in requests
        ]

    def release(self, request: Request) -> None:
        self.ends.pop(request.request_id, None)

    def swap_out(self, request: Request, allocator: BlockAllocator) -> None:
        """preemption="swap": the copy to host memory takes its time on the clock."""
        self.clock.now += self.swap_s_per_token * request.num_computed

    def swap_in(self, request: Request, allocator: BlockAllocator, start: int) -> None:
        self.clock.now += self.swap_s_per_token * (request.num_computed - start)


@dataclass
class SimResult:
    served: list[Served]
    rejected: list[TraceRequest]
    total_time: float  # first arrival to last completion, in simulated seconds
    wall_s: float  # real seconds the simulation took
    steps: int
    counters: dict[str, float] = field(default_factory=dict)  # final VTC counters, if any
    preemptions: int = 0  # reservation "none": requests preempted to make room
    recomputed_tokens: int = 0  # and the tokens prefilled again when they came back
    bound: float | None = None  # the service-gap bound the run guarantees (check_fairness)
    backlogged_gap: float | None = None  # the worst one measured (watch_backlog)
    prompt_tokens: int = 0  # of the requests admitted
    cached_tokens: int = 0  # of which the prefix cache held: prefill saved
    swapped_tokens: int = 0  # preemption="swap": tokens copied to host memory and back
    host_tokens: int = 0  # of which on the host at the end (none: every request finished)
    swap_tokens: int = 0  # the host memory for them (0: no swapping)

    @property
    def prefix_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def simulate(
    trace: Iterable[TraceRequest],
    scheduler: str | Scheduler | EngineConfig = "vtc",
    step_time: str | StepTimeModel = "a10g-llama7b",
    kv_tokens: int | None = None,
    *,
    progress: bool = False,
    watch_backlog: bool = False,
    **config: Any,
) -> SimResult:
    """Replay `trace` through the engine on a virtual clock; every request's client-side record.

    `scheduler`: an `EngineConfig`, or a policy with the config's other fields as keywords
    (`sim_config`: here the pool is `kv_tokens` tokens in blocks of 1 and the reservation
    "peak", the artifact's, unless given). `watch_backlog`: also measure the
    worst service gap of two backlogged clients (slower). With `prefix_caching` the pool
    caches prompt blocks (requests sharing a `prefix_id` share their first `prefix_tokens`)."""
    if kv_tokens is not None:
        config["kv_tokens"] = kv_tokens
    engine_config = sim_config(scheduler, config)
    trace = sorted(trace, key=lambda r: r.arrival_s)
    model = step_time_model(step_time) if isinstance(step_time, str) else step_time
    policy = engine_config.scheduler()
    clock = VirtualClock()
    runner = StepTimeRunner(model, clock)
    block_size = engine_config.block_size
    engine = Engine(
        runner,
        engine_config.allocator(-(-engine_config.pool_tokens // block_size), block_size),
        policy,
        max_positions=1 << 30,
        eos_id=SIM_EOS,
        clock=clock,
        config=replace(engine_config, max_running=1 << 30),
    )
    prefix_caching, cached_weight = engine_config.prefix_caching, engine_config.cached_weight
    start = time.perf_counter()
    watch = BacklogWatch(engine, w_c=cached_weight) if watch_backlog else None
    # PERF: a long simulation makes millions of objects that live to its end, and the collector
    # would walk them all again and again (what it cost: the bench README, `minivtc bench sim`)
    with gc_paused():
        step = watch.step if watch else engine.step
        served, rejected, steps = replay(engine, runner, trace, progress, step, prefix_caching)
    first = trace[0].arrival_s if trace else 0.0
    return SimResult(
        served=served,
        rejected=rejected,
        total_time=max((s.end_s for s in served), default=first) - first,
        wall_s=time.perf_counter() - start,
        steps=steps,
        counters=policy.ledger.counters(),
        bound=engine.fairness.gap_bound() if engine.fairness else None,
        backlogged_gap=watch.worst if watch else None,
        **asdict(engine_stats(engine)),
    )


def sim_config(scheduler: str | Scheduler | EngineConfig, keywords: dict[str, Any]) -> EngineConfig:
    """`simulate`'s config: a pool in tokens (no bytes: there is no device), blocks of 1 token
    (S-LoRA's, the paper's) and the artifact's "peak" reservation unless given; every
    admitted request runs (no max_running); no model (no compile_attention, no
    max_model_len)."""
    if not isinstance(scheduler, EngineConfig):
        keywords = {"block_size": 1, "reservation": "peak"} | keywords
    config = EngineConfig.of(scheduler, **keywords)
    if config.kv_bytes is not None:
        raise ValueError("simulate's pool is in tokens (kv_tokens): there is no device memory")
    if "max_running" in keywords or config.max_running != DEFAULT_RUNNING:
        raise TypeError("simulate runs every admitted request: it takes no max_running")
    if config.compile_attention is not None or config.max_model_len is not None:
        raise TypeError("simulate runs no model: it takes no compile_attention or max_model_len")
    return config


def replay(
    engine: Engine,
    runner: StepTimeRunner,
    trace: list[TraceRequest],
    progress: bool,
    step: Callable[[], list[Request]],
    distinct_prompts: bool = False,
) -> tuple[list[Served], list[TraceRequest], int]:
    """Add each arrival once the clock reaches it, step the engine, record requests as they end.

    `runner` is the engine's (its clock, and the requests that end with EOS). Returns the
    served records, the rejected arrivals and the number of steps."""
    clock = runner.clock
    # One prompt list and one SamplingParams per length, shared: 1M requests stay small. For a
    # prefix cache, prompts differ: equal only over a shared prefix (`prompt_ids`).
    prompt_of = functools.cache(lambda n: [1] * n)
    prefix_tokens: dict[str | None, int] = {}  # prefix id -> its token
    params_of = functools.cache(lambda n, eos: SamplingParams(max_tokens=n, ignore_eos=not eos))
    live: dict[str, tuple[Request, TraceRequest]] = {}
    served, rejected, steps, i, shown = [], [], 0, 0, 0
    bar = progress_bar(len(trace), "simulating", "req", progress)
    while i < len(trace) or engine.has_unfinished():
        while i < len(trace) and trace[i].arrival_s <= clock.now:
            t = trace[i]
            i += 1
            try:
                limited = t.max_tokens is not None and t.max_tokens > t.output_tokens
                params = params_of(t.max_tokens if limited else t.output_tokens, limited)
                prompt = (
                    prompt_ids(t, i, prefix_tokens)
                    if distinct_prompts
                    else prompt_of(t.input_tokens)
                )
                r = engine.add_request(prompt, params, client_id=t.client, arrival_time=t.arrival_s)
                live[r.request_id] = (r, t)
                if limited:  # it ends with EOS after output_tokens, not at max_tokens
                    runner.ends[r.request_id] = t.output_tokens
            except ValueError:
                rejected.append(t)
        if not engine.has_unfinished():
            if i == len(trace):
                break  # the last arrivals were all rejected
            clock.now = max(clock.now, trace[i].arrival_s)
            continue
        for r in step():
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


def prompt_ids(t: TraceRequest, i: int, prefix_tokens: dict[str | None, int]) -> list[int]:
    """Token ids for trace request number `i`: its prefix's (one token per `prefix_id`, the
    same for every request with it), then its own (a token no other request has)."""
    token = prefix_tokens.setdefault(t.prefix_id, len(prefix_tokens))
    shared = [token] * t.prefix_tokens
    return shared + [-1 - i] * (t.input_tokens - len(shared))


def progress_bar(total: float, desc: str, unit: str, enabled: bool = True) -> tqdm:
    """A tqdm bar on stderr, or a silent one when not `enabled`. On a terminal it redraws in
    place; in a log or CI, where every redraw lengthens one line, it redraws every 30 s."""
    interval = 0.1 if sys.stderr.isatty() else 30.0
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        disable=not enabled,
        mininterval=interval,
        leave=None,
        dynamic_ncols=True,
    )


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a while (process-wide). A simulation makes
    millions of small objects and no reference cycles; with a million requests waiting, every
    full collection walks them all (what that cost: minivtc/bench/README.md)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def record(request: Request, t: TraceRequest) -> Served:
    assert request.first_token_time is not None and request.finish_time is not None
    ttft, latency = request.first_token_time - t.arrival_s, request.finish_time - t.arrival_s
    return Served(
        t.client, t.arrival_s, t.input_tokens, t.output_tokens, ttft, latency, request.num_cached
    )
