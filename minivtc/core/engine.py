"""The engine: iteration-level continuous batching over a paged KV pool, driven by a scheduler.

Owns the request lifecycle (`request.py`) and the step loop. Between any two steps requests may
join (admission) and leave (finish, abort) the running batch. One step:

    schedule -> run -> append -> charge -> retire

- schedule: the scheduler offers waiting requests in its order; the admission policy
  (`admission.py`) reserves each one's blocks if they fit, and the first misfit ends the round;
- run: the runner computes every running request's new tokens in one forward pass (a prompt
  for the newly admitted, one token for the rest) and samples one token each;
- append: each token is appended and detokenized, and the stop rules (`params.py`) say whether
  it ended its request;
- charge: the step's tokens are charged to their clients, in one scheduler call;
- retire: finished requests leave the batch and give their blocks back.

The runner is the only part that touches tensors; `sim.py` replaces it with a step-time model
and `time.monotonic` with a virtual clock, so a simulation runs this same code, policy and all.
A fault in one request's own work (its sampler, its detokenizer) ends that request alone, with
finish_reason "error"; a fault in shared work (the forward pass, the pool, the scheduler)
propagates, and whoever runs the engine must stop. Does not own: the policy (`scheduler.py`),
blocks (`kv_pool.py`), attention (`attention.py`), what a preempted request keeps
(`preemption.py`), the checks before a request is queued (`intake.py`). Lesson 3.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from minivtc.core.admission import make_admission
from minivtc.core.intake import RequestRejected, encode, validate
from minivtc.core.kv_pool import BlockAllocator
from minivtc.core.params import SamplingParams, releasable, stop_reason, trim_stop
from minivtc.core.preemption import Preemption
from minivtc.core.request import ClientTokens, Request, Status, StepOutput
from minivtc.core.scheduler import Scheduler

if TYPE_CHECKING:  # the engine only calls it: the simulator runs without a tokenizer
    from minivtc.core.tokenizer import Tokenizer


class Runner(Protocol):
    def run(self, requests: list[Request], allocator: BlockAllocator) -> list[int | Exception]:
        """One new token per request, or the exception that ended that request's own part."""
        ...

    def release(self, request: Request) -> None: ...

    # preemption="swap" only: a request's computed keys and values to host memory, and back
    # from position `start` (those before it a prefix cache holds)
    def swap_out(self, request: Request, allocator: BlockAllocator) -> None: ...

    def swap_in(self, request: Request, allocator: BlockAllocator, start: int) -> None: ...


class Engine:
    """Continuous batching: `add_request`, `step`, `abort`.

    Collaborators: `runner` (a forward pass, or the simulator's step-time model), `allocator`
    (the KV blocks), `scheduler` (the policy). Options: `reservation` "full" (the paper's),
    "peak" (the artifact's check) or "none" (blocks on demand, preempting a `victim`, "latest"
    or "fair", when they run out; `admission.py`); `preempt_gap` (the fair victim also
    preempts a client leading a waiting one by more, to admit it; default the policy's, w_q M
    / 4 for VTC); `preemption` "recompute" (a preempted request is prefilled again) or "swap"
    (its keys and values go to host memory and back), with `swap_tokens` of host memory
    (default the pool's size; a preemption that would need more recomputes); `admit_every`
    (the artifact admits every 10 steps); `check_invariants` (every invariant after every
    step, for tests);
    `check_fairness` (the policy's bound after every step: Lemma 4.3, or the preemptive
    bound; a VTC-family scheduler).
    """

    def __init__(
        self,
        runner: Runner,
        allocator: BlockAllocator,
        scheduler: Scheduler,
        max_positions: int,
        eos_id: int,
        tokenizer: Tokenizer | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_running: int = 256,
        reservation: str = "full",
        victim: str = "latest",
        preempt_gap: float | None = None,
        preemption: str = "recompute",
        swap_tokens: int | None = None,
        admit_every: int = 1,
        check_invariants: bool = False,
        check_fairness: bool = False,
    ) -> None:
        self.runner, self.allocator, self.scheduler = runner, allocator, scheduler
        # The fair victim displaces clients running more than `preempt_gap` ahead of a
        # waiting one (`admission.Fair`); the policy says its default and adapts its lift.
        self.preempt_gap = None
        if reservation == "none" and victim == "fair":
            self.preempt_gap = scheduler.set_preempt_gap(preempt_gap, allocator.num_tokens)
        self.admission = make_admission(reservation, allocator, scheduler, victim, self.preempt_gap)
        self.max_positions, self.eos_id, self.tokenizer, self.clock = (
            max_positions,
            eos_id,
            tokenizer,
            clock,
        )
        self.max_running, self.admit_every = max_running, admit_every
        self.preemption = Preemption(preemption, swap_tokens, allocator)  # what a victim keeps
        self.check_invariants, self.check_fairness = check_invariants, check_fairness
        if check_fairness:
            self.set_bound(reservation)
        self.running: list[Request] = []  # the batch
        self.requests: dict[str, Request] = {}  # every live request (waiting or running) by id
        self.client_tokens: dict[str, ClientTokens] = {}
        self.detokenizers: dict = {}  # request id -> Detokenizer (none without a tokenizer)
        self.steps_since_admission = 0
        self.num_preemptions = 0  # requests preempted (reservation "none")
        self.num_prompt_tokens = 0  # prompt tokens of the requests admitted (once each)
        self.num_cached_tokens = 0  # of which found in the prefix cache: prefill saved
        self.ids = itertools.count()

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        client_id: str = "default",
        request_id: str | None = None,
        arrival_time: float | None = None,
        cache_salt: str | None = None,
    ) -> Request:
        """Queue a request. Raises `RequestRejected` (and changes nothing) if it cannot run.

        `arrival_time` defaults to now; a simulator replaying a trace passes the trace's time.
        `cache_salt`: a prefix cache shares blocks only between requests with the same salt.
        """
        prompt_ids = encode(prompt, self.tokenizer)
        request_id = request_id if request_id is not None else f"req-{next(self.ids)}"
        if request_id in self.requests:
            raise RequestRejected(f"request id {request_id!r} is already in use")
        validate(prompt_ids, params, self.max_positions, self.allocator)
        arrival = self.clock() if arrival_time is None else arrival_time
        request = Request(
            request_id, client_id, prompt_ids, params, arrival_time=arrival, cache_salt=cache_salt
        )
        reason = self.scheduler.add(request, request.arrival_time)
        if reason is not None:
            raise RequestRejected(reason, kind="rate_limited")
        self.requests[request_id] = request
        if self.tokenizer is not None:
            self.detokenizers[request_id] = self.tokenizer.detokenizer(prompt_ids)
        return request

    def step(self) -> list[Request]:
        """One iteration: schedule -> run -> append -> charge -> retire. Returns the requests
        that ran, each with its new token (`output_ids[-1]`); finished ones have their
        `finish_reason`. A server streams `output(request)` for each."""
        self.schedule()  # admit waiting requests while they fit
        self.admission.grow(self.running, self.preempt)  # blocks for the positions it writes
        batch = list(self.running)
        if not batch:
            return []
        tokens = self.runner.run(batch, self.allocator)  # one forward pass, a token each
        for request, token in zip(batch, tokens, strict=True):
            self.append(request, token)  # detokenize; the stop rules
        self.scheduler.on_decode(batch)  # charge the step's tokens to their clients
        for request in batch:
            # PERF: finish_reason, not `is_finished` (an Enum read per token): -3% instructions
            if request.finish_reason is not None:
                self.retire(request)  # its blocks back to the pool
        self.check()
        return batch

    def abort(self, request_id: str) -> None:
        """Stop a request now: out of the queue or the batch, its blocks freed at once."""
        request = self.requests.get(request_id)
        if request is None:
            return  # already finished (or never existed): aborting is idempotent
        if request.status is Status.WAITING:
            self.scheduler.remove(request)
        request.status, request.finish_reason = Status.ABORTED, "abort"
        request.finish_time = self.clock()
        if request in self.running:
            self.retire(request)
        else:
            self.forget(request)

    def output(self, request: Request) -> StepOutput:
        """What the last step gave `request`: its token, and the text it may release now (held
        back while it could still turn out to be the start of a stop sequence). A failure here
        is the request's own: it ends with reason "error"."""
        last = request.output_ids[-1] if request.output_ids else -1
        if request.finish_reason != "error":
            try:
                finished = request.finish_reason is not None
                upto = releasable(request.text, request.params.stop, finished=finished)
                delta = request.text[request.num_text_sent : max(upto, request.num_text_sent)]
                request.num_text_sent += len(delta)
                return StepOutput(request.request_id, last, delta, finished, request.finish_reason)
            except Exception as e:
                self.fail(request, e)
                if request in self.running:
                    self.retire(request)
        return StepOutput(request.request_id, last, "", True, "error", request.error)

    # The waste a preemption costs (`preemption.py`), counted with the engine's own numbers
    recomputed_tokens = property(lambda self: self.preemption.recomputed_tokens)
    swapped_tokens = property(lambda self: self.preemption.swapped_tokens)

    def has_unfinished(self) -> bool:
        # Called every step: ask for one waiting request, not for a count of them all.
        return bool(self.running) or next(iter(self.scheduler.waiting()), None) is not None

    def forget_idle_clients(self) -> dict[str, ClientTokens]:
        """Drop what the engine and the policy keep about clients with nothing waiting or
        running, where the policy says that changes no decision (`Scheduler.forget`); return
        the forgotten clients' token counts (a server sums them into its totals)."""
        busy = {r.client_id for r in self.requests.values()}
        idle = sorted((set(self.client_tokens) | set(self.scheduler.accounts())) - busy)
        gone = self.scheduler.forget(idle, self.clock())
        return {c: self.client_tokens.pop(c, ClientTokens()) for c in gone}

    def set_bound(self, reservation: str) -> None:
        """check_fairness: the scheduler asserts its bound after every step. L_input is the
        longest prompt that can ever be admitted, M the pool, B the most requests at once."""
        if reservation == "none" and self.preempt_gap is None:
            raise ValueError(
                "check_fairness: no bound is stated for blocks on demand with the latest victim "
                "(preempting the most recent request can break Lemma 4.3's); use victim='fair'"
            )
        if reservation == "peak":
            raise ValueError(
                "check_fairness: no bound is stated for the artifact's peak check (requests that "
                "finish early let the others grow past M, and Lemma 4.3's U can fail); use "
                "reservation='full' (the paper's model) or 'none' with victim='fair'"
            )
        pool = self.allocator.num_tokens
        self.scheduler.set_bound(
            max_input=min(self.max_positions, pool) - 1,
            pool_tokens=pool,
            max_running=min(self.max_running, self.allocator.num_blocks),
        )

    def check(self) -> None:
        """After a step: every invariant (check_invariants), or Lemma 4.3 (check_fairness)."""
        if self.check_invariants:
            self.check_shared_state()
            held = set(self.allocator.block_tables)
            assert held == {r.request_id for r in self.running}, (
                f"blocks held by {sorted(held)} but running {[r.request_id for r in self.running]}"
            )
            assert all(r.status is Status.RUNNING for r in self.running)
            self.admission.check(self.running)
            self.preemption.check(self.requests)
        elif self.check_fairness:
            self.scheduler.check_invariants()

    def check_shared_state(self) -> None:
        """The pool and the scheduler are sound. If not, this raises, and whoever runs the
        engine must stop: it can no longer be trusted."""
        self.allocator.check_invariants()
        self.scheduler.check_invariants()

    # --- the step's parts ------------------------------------------------------------------------

    def schedule(self) -> None:
        """Let the scheduler admit waiting requests: every step (the artifact: `admit_every`
        steps after a successful admission, every step while a try admits nothing)."""
        if not self.running or self.steps_since_admission + 1 >= self.admit_every:
            before = len(self.running)
            self.scheduler.schedule(self.admit)
            if len(self.running) > before:
                self.steps_since_admission = -1
        self.steps_since_admission += 1

    def admit(self, request: Request) -> bool:
        """The scheduler's callback: admit `request` if the batch has room and its blocks fit.
        The prompt is charged now, before the next pick (Algorithm 2)."""
        while len(self.running) >= self.max_running or not self.admission.try_admit(request):
            victim = self.admission.displace(request, self.running)  # the fair victim only
            if victim is None:
                return False
            self.preempt(victim)
        request.status, request.admitted_time = Status.RUNNING, self.clock()
        self.running.append(request)
        cached = self.allocator.cached_tokens(request.request_id)
        if self.preemption.readmit(request, cached, self.runner):
            return True  # back after a preemption: its prompt was charged once, at first
        # A prefix cache may hold its prompt's first blocks: its prefill starts after them.
        request.num_computed = cached
        request.num_cached = request.num_computed  # the scheduler may price them (w_c)
        self.num_prompt_tokens += request.num_prompt
        self.num_cached_tokens += request.num_cached
        tokens = self.client_tokens.setdefault(request.client_id, ClientTokens())
        tokens.num_input += request.num_prompt
        tokens.num_cached += request.num_cached
        self.scheduler.on_tokens(request, request.num_prompt, 0)
        return True

    def preempt(self, request: Request) -> None:
        """Make room (reservation "none"): `request` leaves the batch, its blocks are freed,
        and it waits at the head of its client's queue, keeping the tokens it generated; when
        it is admitted again they are prefilled again (recompute), or, with preemption="swap",
        its keys and values, copied to host memory now, are copied back. Its client is not
        charged again: the recomputation (or the copy) is the server's cost, not service."""
        self.running.remove(request)
        self.preemption.keep(request, self.runner)  # before its blocks are freed
        self.admission.release(request)
        request.status = Status.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.scheduler.requeue(request)

    def append(self, request: Request, token: int | Exception) -> None:
        """Give `request` its new token; finish it if that token ends it. A fault in the
        request's own work (its sampling, its text) ends it alone, with reason "error"."""
        try:
            if isinstance(token, Exception):  # its sampler failed (the runner caught it)
                raise token
            # PERF: len(), not the num_tokens property, on the per-token lines (a property
            # call costs more than the addition): -7% instructions in `minivtc bench sim`.
            prefilled = request.num_computed < len(request.prompt_ids)
            request.num_computed = len(request.prompt_ids) + len(request.output_ids)
            if prefilled:  # its prompt's blocks are computed: a prefix cache may name them
                self.allocator.cache_prompt(
                    request.request_id, request.prompt_ids, request.num_computed, request.cache_salt
                )
            request.output_ids.append(token)
            if request.first_token_time is None:
                request.first_token_time = self.clock()
            self.client_tokens[request.client_id].num_output += 1
            detok = self.detokenizers.get(request.request_id)
            if detok is not None:  # (None: token ids only, as in the simulator: no text)
                request.text += detok.add(token)
            reason = stop_reason(
                token, len(request.output_ids), request.text, request.params, self.eos_id
            )
            if reason:
                self.finish(request, reason)
        except Exception as e:
            self.fail(request, e)

    def finish(self, request: Request, reason: str) -> None:
        """Mark finished; flush held-back text and cut the stop sequence off the text."""
        request.status, request.finish_reason = Status.FINISHED, reason
        request.finish_time = self.clock()
        detok = self.detokenizers.get(request.request_id)
        if detok is not None:
            request.text += detok.flush()
        if reason == "stop":
            request.text = trim_stop(request.text, request.params.stop)

    def fail(self, request: Request, cause: BaseException) -> None:
        """A fault in `request`'s own work: it ends with reason "error" and the error says
        why, for the client; it is retired with the step's finished requests."""
        request.status, request.finish_reason = Status.ABORTED, "error"
        request.error = f"{type(cause).__name__}: {cause}"
        request.finish_time = self.clock()

    def retire(self, request: Request) -> None:
        self.running.remove(request)
        self.admission.release(request)
        self.scheduler.on_finish(request)
        self.forget(request)
        if request.finish_reason == "error":  # its fault must not have hurt shared state
            self.check_shared_state()

    def forget(self, request: Request) -> None:
        self.preemption.forget(request)
        self.runner.release(request)
        self.requests.pop(request.request_id, None)
        self.detokenizers.pop(request.request_id, None)
