"""The engine: iteration-level continuous batching over a paged KV pool, driven by a scheduler.

Owns the request lifecycle (`request.py`) and the step loop (Algorithm 1). Between any two steps
requests may join (admission) and leave (finish, abort) the running batch. One step:

    schedule -> grow -> run -> append -> charge -> retire

schedule is Algorithm 2's admission round as the paper writes it: ask the scheduler which request
is next (`peek`), make room for it or stop the round (never skip), reserve its blocks,
`dispatch` it (the scheduler charges its prompt, once). grow gives the step's positions blocks (on
demand: preempting a victim when they run out). run is one forward pass, a token per request;
append detokenizes and applies the stop rules (`params.py`); charge is one scheduler call;
retire gives finished requests' blocks back.

Control flows down: the engine asks the scheduler, the admission policy, the victim and the pool;
none of them calls back (an observer in `on_preempt` is told, not asked). Only the runner touches
tensors; `sim/simulator.py` replaces it with a step-time model and the clock with a virtual one, so
a simulation runs this same code, policy and all. A fault in one request's own work (its sampler,
its detokenizer) ends that request alone, with finish_reason "error"; a fault in shared work
propagates, and whoever runs the engine must stop. Does not own: the policy (`scheduler.py`),
whether blocks may be reserved (`admission.py`), blocks (`kv_pool.py`), whom to preempt and what a
victim keeps (`preemption.py`), the fairness check (`fairness_check.py`), the checks before a
request is queued (`intake.py`). After the class: its reports (`engine_stats`, `blocks_by_client`),
the checks, and the server's housekeeping between steps (`forget_idle_clients`). Lesson 3.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from minivtc.engine.admission import make_admission
from minivtc.engine.engine_config import EngineConfig
from minivtc.engine.intake import RequestRejected, checked_params, encode, max_model_len
from minivtc.engine.kv_pool import BlockAllocator
from minivtc.engine.preemption import Fair, Preemption, make_victim
from minivtc.engine.text import Texts
from minivtc.fairness.fairness_check import FairnessCheck
from minivtc.fairness.scheduler import Scheduler, admission_round
from minivtc.requests.params import SamplingParams, stop_reason
from minivtc.requests.request import ClientTokens, Request, Status, StepOutput

if TYPE_CHECKING:  # the engine only calls them: the simulator runs without torch or tokenizer
    from minivtc.engine.runner import Runner
    from minivtc.model.tokenizer import Tokenizer

__all__ = ["Engine", "EngineConfig", "RequestRejected", "StepOutput", "blocks_by_client"]
__all__ += ["build_fairness_check", "engine_stats", "forget_idle_clients"]

DEFAULTS = EngineConfig()  # frozen: one value serves every engine


class Engine:
    """Continuous batching: `add_request`, `step`, `abort`, `output`. Collaborators: `runner`
    (a forward pass, or a step-time model), `allocator` (KV blocks; a `PrefixCachingAllocator`
    caches prompts), `scheduler` (the policy); `config` (its options: `engine_config.py`)."""

    def __init__(
        self,
        runner: Runner,
        allocator: BlockAllocator,
        scheduler: Scheduler,
        max_positions: int,
        eos_id: int,
        tokenizer: Tokenizer | None = None,
        clock: Callable[[], float] = time.monotonic,
        config: EngineConfig = DEFAULTS,
    ) -> None:
        self.runner, self.allocator, self.scheduler = runner, allocator, scheduler
        self.max_positions, self.eos_id, self.config = max_positions, eos_id, config
        self.tokenizer, self.clock = tokenizer, clock
        self.max_model_len = max_model_len(max_positions, allocator)  # (`intake.py`)
        self.cache = allocator if allocator.caches_prefixes else None  # (None: no prefix cache)
        self.admission = make_admission(config.reservation, allocator)
        self.victim = make_victim(config, scheduler, allocator)  # (fair: sets the policy's gap)
        self.preemption = Preemption(config, allocator, self.cache)  # what a victim keeps
        self.fairness = build_fairness_check(self) if config.check_fairness else None
        self.running: list[Request] = []  # the batch
        self.requests: dict[str, Request] = {}  # every live request (waiting or running) by id
        self.client_tokens: dict[str, ClientTokens] = {}
        self.texts = Texts(tokenizer)  # each live request's text (none without a tokenizer)
        self.steps_since_admission = 0
        self.num_preemptions = 0  # requests preempted (reservation "none")
        self.num_prompt_tokens = 0  # prompt tokens of the requests admitted (once each)
        self.num_cached_tokens = 0  # of which found in the prefix cache: prefill saved
        self.ids = itertools.count()
        self.on_preempt: list[Callable[[Request], None]] = []  # observers, told before a preemption

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        client_id: str = "default",
        request_id: str | None = None,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
    ) -> Request:
        """Queue a request, or raise `RequestRejected` and change nothing. `arrival_time`: now,
        or a trace's; `cache_salt`: a prefix cache shares blocks only within one salt."""
        prompt_ids = encode(prompt, self.tokenizer)
        request_id = request_id if request_id is not None else f"req-{next(self.ids)}"
        if request_id in self.requests:
            raise RequestRejected(f"request id {request_id!r} is already in use")
        params = checked_params(prompt_ids, params, self.max_positions, self.allocator)
        arrival = self.clock() if arrival_time is None else arrival_time
        request = Request(request_id, client_id, prompt_ids, params, arrival, cache_salt=cache_salt)
        reason = self.scheduler.add(request, request.arrival_time)
        if reason is not None:
            raise RequestRejected(reason, kind="rate_limited")
        self.requests[request_id] = request
        self.texts.open(request)
        if self.fairness is not None:
            self.fairness.check_spread()  # its client may have joined Q, lifted
        return request

    def step(self) -> list[Request]:
        """schedule -> grow -> run -> append -> charge -> retire: the requests that ran, each
        with its new token (a server streams `output`). One whose sampler failed is charged
        with the batch (`append` gave it no token: nothing more to charge) and retired. With
        nothing running: [] once `grow` is done, no run, no charge, no `check`."""
        self.schedule()  # Algorithm 2: admit waiting requests while they fit
        self.grow()  # blocks for the positions this step writes
        batch = list(self.running)
        if not batch:
            return []
        tokens = self.runner.run(batch, self.allocator)  # one forward pass, a token each
        for request, token in zip(batch, tokens, strict=True):
            self.append(request, token)  # detokenize; the stop rules
        self.charge(batch)  # the step's tokens to their clients
        for request in batch:  # PERF: finish_reason, not `is_finished` (an Enum read a token)
            if request.finish_reason is not None:
                self.retire(request)  # its blocks back to the pool
        self.check()
        return batch

    def abort(self, request_id: str) -> None:
        """Stop a request now: out of the queue or the batch, its blocks freed at once."""
        request = self.requests.get(request_id)
        if request is None:
            return  # already finished (or never existed): aborting is idempotent
        running = request.status is Status.RUNNING
        request.end(Status.ABORTED, "abort", self.clock())
        if running:
            self.retire(request)
            return
        self.scheduler.remove(request)  # out of Q
        if request.num_preemptions:  # dispatched once: the policy closes its books
            self.scheduler.on_finish(request)
        self.forget(request)

    def output(self, request: Request) -> StepOutput:
        """What the last step gave `request` (`StepOutput.take`), for a server to stream."""
        return StepOutput.take(request)

    def has_unfinished(self) -> bool:
        # Not peek(): a policy's peek may begin a turn (DRR), and asking must change nothing.
        return bool(self.running) or next(iter(self.scheduler.waiting()), None) is not None

    # --- the step's parts ------------------------------------------------------------------------

    def schedule(self) -> None:
        """Algorithm 2's admission round (`admission_round`), each step (`admit_every`: the
        artifact's, only that many steps after one that grew the batch)."""
        self.steps_since_admission += 1
        if self.running and self.steps_since_admission < self.config.admit_every:
            return
        before, check = len(self.running), self.fairness
        admission_round(self.scheduler, self.make_room, check.dispatched if check else None)
        if len(self.running) > before:
            self.steps_since_admission = 0

    def make_room(self, request: Request) -> bool:
        """Reserve `request`'s blocks and admit it, if the batch has room and they fit (the fair
        victim may displace running clients far ahead of it until they do); False: they don't."""
        while len(self.running) >= self.config.max_running or not self.admission.reserve(request):
            victim = self.victim.displace(request, self.running) if self.victim else None
            if victim is None:
                return False
            self.preempt(victim)
        self.admit(request)
        return True

    def admit(self, request: Request) -> None:
        """`request`, its blocks reserved, joins the batch: readmitted (`Preemption.readmit`),
        or new, its prefill starting after the prompt blocks the prefix cache holds."""
        request.status, request.admitted_time = Status.RUNNING, self.clock()
        self.running.append(request)
        cached = self.cache.cached_tokens(request.request_id) if self.cache else 0
        if request.num_preemptions:
            self.preemption.readmit(request, cached, self.runner)
            return
        request.num_computed = request.num_cached = cached  # the scheduler may price them (w_c)
        self.num_prompt_tokens += request.num_prompt
        self.num_cached_tokens += cached
        self.client_tokens.setdefault(request.client_id, ClientTokens()).admit(request, cached)

    def grow(self) -> None:
        """Blocks for the positions this step writes (on demand: preempting until they fit)."""
        while self.victim and self.admission.blocks_short(self.running) > 0:
            self.preempt(self.victim.choose(self.running))
        self.admission.grow(self.running)

    def preempt(self, request: Request) -> None:
        """`request` leaves the batch and waits at the head of its client's queue with what it
        keeps (`Preemption.keep`), uncharged: recomputing (or copying) is the server's cost.
        The `on_preempt` observers hear of it first (`backlog.watch_rejoining`)."""
        for observer in self.on_preempt:
            observer(request)
        self.running.remove(request)
        self.preemption.keep(request, self.runner)  # before its blocks are freed
        self.admission.release(request)
        request.status = Status.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.scheduler.requeue(request)
        if self.fairness is not None:
            self.fairness.check_spread()  # its client may have joined Q, lifted

    def append(self, request: Request, token: int | Exception) -> None:
        """Give `request` its new token; finish it if that token ends it. A fault in its own
        work (its sampling, as the runner reports, or its text) ends it alone: "error"."""
        if isinstance(token, Exception):  # its sampler failed (the runner caught it)
            request.fail(token, self.clock())  # (retired with the step)
            return
        try:
            # PERF: len(), not the num_tokens property (a property read per token: bench README)
            prefilled = request.num_computed < len(request.prompt_ids)
            request.num_computed = len(request.prompt_ids) + len(request.output_ids)
            if prefilled and self.cache:  # its prompt's blocks are computed: the cache names them
                self.cache.cache_prompt(
                    request.request_id, request.prompt_ids, request.num_computed, request.cache_salt
                )
            request.output_ids.append(token)
            if request.first_token_time is None:
                request.first_token_time = self.clock()
            self.client_tokens[request.client_id].num_output += 1
            if self.tokenizer is not None:  # (the simulator keeps token ids only: no text)
                self.texts.add(request, token)
            n = len(request.output_ids)
            if reason := stop_reason(token, n, request.text, request.params, self.eos_id):
                request.end(Status.FINISHED, reason, self.clock())
                self.texts.finish(request, reason)  # its text complete, a stop string cut
        except Exception as e:
            request.fail(e, self.clock())

    def charge(self, batch: list[Request]) -> None:
        """Algorithm 2's "c_i <- c_i + the cost of i's new tokens", one scheduler call."""
        with self.fairness.step(batch) if self.fairness else nullcontext():  # (its charges)
            self.scheduler.on_decode(batch)

    def retire(self, request: Request) -> None:
        self.running.remove(request)
        self.admission.release(request)
        self.scheduler.on_finish(request)
        self.forget(request)
        if request.finish_reason == "error":  # its fault must not have hurt shared state
            check_shared_state(self)

    def forget(self, request: Request) -> None:
        if request.num_preemptions:  # (what a victim kept: `Preemption.forget`)
            self.preemption.forget(request)
        self.runner.release(request)
        self.requests.pop(request.request_id, None)
        self.texts.close(request)

    def check(self) -> None:
        """After a step: every invariant (check_invariants), the bound (check_fairness)."""
        if self.config.check_invariants:
            check_invariants(self)
        if self.fairness is not None:
            self.fairness.check()


@dataclass(frozen=True)
class EngineStats:
    """The engine's counters (`engine_stats`)."""

    preemptions: int  # requests preempted to make room (reservation "none")
    recomputed_tokens: int  # keys and values computed again after a preemption: waste
    swapped_tokens: int  # keys and values a preemption copied to host memory and back
    prompt_tokens: int  # of the requests admitted (once each)
    cached_tokens: int  # of which the prefix cache held: prefill saved
    host_tokens: int  # preemption="swap": keys and values on the host now
    swap_tokens: int  # and how many it may hold (0: no swapping)


def engine_stats(engine: Engine) -> EngineStats:
    """What `engine` has counted since it started (the simulator's result and the server's
    snapshot take these as they are)."""
    p = engine.preemption
    return EngineStats(
        preemptions=engine.num_preemptions,
        recomputed_tokens=p.recomputed_tokens,
        swapped_tokens=p.swapped_tokens,
        prompt_tokens=engine.num_prompt_tokens,
        cached_tokens=engine.num_cached_tokens,
        host_tokens=p.host_tokens,
        swap_tokens=p.swap_tokens if engine.config.swaps else 0,
    )


def blocks_by_client(engine: Engine) -> dict[str, int]:
    """Per client, the KV blocks its live requests hold now (read only; a block that one
    prefix shares among its requests counts once)."""
    held: dict[str, set[int]] = {}
    for request_id, table in engine.allocator.block_tables.items():
        if request_id in engine.requests:
            held.setdefault(engine.requests[request_id].client_id, set()).update(table)
    return {client: len(blocks) for client, blocks in held.items()}


def build_fairness_check(engine: Engine) -> FairnessCheck:
    """The check for `engine`'s run: L_input the longest prompt that can ever be admitted, M
    the pool, B the most requests at once (the batch's limit, or the pool's blocks)."""
    most = min(engine.config.max_running, engine.allocator.num_blocks)
    pool, reservation = engine.allocator.num_tokens, engine.config.reservation
    gap = engine.victim.gap if isinstance(engine.victim, Fair) else None
    return FairnessCheck(engine.scheduler, engine.max_model_len - 1, pool, most, reservation, gap)


def forget_idle_clients(engine: Engine) -> dict[str, ClientTokens]:
    """Drop `engine`'s idle clients where the policy says no decision changes
    (`Ledger.forget`); return their token counts (a server sums them into its totals)."""
    busy = {r.client_id for r in engine.requests.values()}
    idle = sorted((set(engine.client_tokens) | set(engine.scheduler.ledger.accounts())) - busy)
    gone = engine.scheduler.ledger.forget(idle, engine.clock())
    return {c: engine.client_tokens.pop(c, ClientTokens()) for c in gone}


def check_shared_state(engine: Engine) -> None:
    """The pool and the scheduler are sound (else whoever runs the engine must stop)."""
    engine.allocator.check_invariants()
    engine.scheduler.check_invariants()


def check_invariants(engine: Engine) -> None:
    """Every invariant of a step's end: the pool, the scheduler, the blocks held by exactly
    the running requests, admission's and preemption's own books."""
    check_shared_state(engine)
    held, running = set(engine.allocator.block_tables), engine.running
    assert held == {r.request_id for r in running}, (
        f"blocks held by {sorted(held)} but running {[r.request_id for r in running]}"
    )
    assert all(r.status is Status.RUNNING for r in running), "a running request is not RUNNING"
    engine.admission.check(running)
    engine.preemption.check(engine.requests)
