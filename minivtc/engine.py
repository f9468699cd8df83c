"""The engine: iteration-level continuous batching over a paged KV pool, driven by a scheduler.

Owns the request lifecycle (`request.py`) and the step loop. Between any two steps requests may
join (admission) and leave (finish, abort) the running batch. One step:

    schedule -> run -> append -> finish/free

- schedule: the scheduler offers waiting requests in its order; each is admitted if its whole
  length (prompt + max_tokens) fits in the free blocks — reserved up front, so the pool never
  runs out mid-decode (the paper's model; the M of Lemma 4.3 and Theorem 4.4 is this reservation).
  `reservation="peak"` is the artifact's finer check: admit if the pool's peak, with every
  running request going to its max_tokens in order of what it has left, still fits; blocks
  are then allocated as requests grow, and the check guarantees they always can be;
- run: the runner computes every running request's new tokens in one forward pass (a prompt
  for the newly admitted, one token for the rest) and samples one token each;
- append: each token is appended and detokenized; the step's tokens are charged to their
  clients in one scheduler call;
- finish/free: finished requests (EOS, max_tokens, stop sequence) give their blocks back.

`advance()` is that step; `step()` is `advance()` plus one `StepOutput` (token, text) per
request that ran, for the server to stream. The simulator needs no text and calls `advance()`.

The runner is the only part that touches tensors; `sim.py`'s cost model replaces it and a
virtual clock replaces `time.monotonic`, so simulations run this same code. Does not own: the
policy (`scheduler.py`), blocks (`kv_pool.py`), attention (`attention.py`). Lesson 3.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from minivtc.generate import context_error, releasable, stop_reason, trim_stop
from minivtc.kv_pool import BlockAllocator
from minivtc.request import Request, RequestFailed, Status
from minivtc.sampler import SamplingParams
from minivtc.scheduler import Scheduler
from minivtc.tokenizer import Detokenizer, Tokenizer


class RequestRejected(ValueError):
    """`add_request` refused a request; nothing else was disturbed. `reason` says why.

    `kind` is "invalid" (can never run here: too long for the context or the pool) or
    "rate_limited" (the policy refused it now, e.g. RPM; the server answers 429).

    `param` names the request field at fault ("prompt" or "max_tokens"), for an HTTP error body.
    """

    def __init__(self, reason: str, kind: str = "invalid", param: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.kind, self.param = reason, kind, param


class Runner(Protocol):
    def run(self, requests: list[Request], allocator: BlockAllocator) -> list[int]: ...

    def release(self, request: Request) -> None: ...


class StepOutput(NamedTuple):
    """What one step did for one request: the token it got and the text that token completed.

    A named tuple, not a frozen dataclass: one is made per token, and a tuple is built about
    twice as fast (it matters to the simulator, which makes hundreds of thousands)."""

    request_id: str
    token_id: int
    text_delta: str
    finished: bool
    finish_reason: str | None
    error: str | None = None  # finish_reason "error": what failed


@dataclass
class ClientTokens:
    """Tokens the engine has processed for one client (the fairness layer's raw material)."""

    num_input: int = 0
    num_output: int = 0


@dataclass
class Engine:
    runner: Runner
    allocator: BlockAllocator
    scheduler: Scheduler
    max_positions: int  # the model's context window
    eos_id: int
    tokenizer: Tokenizer | None = None
    clock: Callable[[], float] = time.monotonic
    max_running: int = 256  # requests in the running batch at most
    check_invariants: bool = False  # run every check_invariants() after every step (tests)
    check_fairness: bool = False  # assert Lemma 4.3 (VTC's counter spread <= U) after every step
    reservation: str = "full"  # "full": reserve prompt + max_tokens; "peak": the artifact's check
    admit_every: int = 1  # the artifact admits only every 10 steps (lessons/artifact_deviations.md)
    steps_since_admission: int = 0
    final_blocks: int = 0  # "peak": blocks the running requests will hold at their last step
    num_steps: int = 0  # steps that ran a batch: step T is the T-th
    # "peak": each running request's (last, base): during step T it holds K/V for
    # base + T - 1 positions, until step T = last (`span`, `peak_blocks`).
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    running: list[Request] = field(default_factory=list)
    requests: dict[str, Request] = field(default_factory=dict)  # every live request by id
    client_tokens: dict[str, ClientTokens] = field(default_factory=dict)
    detokenizers: dict[str, Detokenizer] = field(default_factory=dict)
    ids: itertools.count = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        if self.reservation not in ("full", "peak"):
            raise ValueError(f"reservation must be 'full' or 'peak', got {self.reservation!r}")
        if self.check_fairness:
            if not hasattr(self.scheduler, "set_bound"):
                raise ValueError(
                    f"check_fairness needs a VTC-family scheduler, not {self.scheduler.name}"
                )
            # L_input: the longest prompt that can ever be admitted (one output token at least).
            pool = self.allocator.num_tokens
            self.scheduler.set_bound(max_input=min(self.max_positions, pool) - 1, pool_tokens=pool)

    def add_request(
        self, prompt: str | list[int], params: SamplingParams, client_id: str = "default",
        request_id: str | None = None, arrival_time: float | None = None,
    ) -> Request:  # fmt: skip
        """Queue a request. Raises `RequestRejected` (and changes nothing) if it cannot run.

        `arrival_time` defaults to now; a simulator replaying a trace passes the trace's time.
        """
        prompt_ids = self.encode(prompt)
        request_id = request_id if request_id is not None else f"req-{next(self.ids)}"
        if request_id in self.requests:
            raise RequestRejected(f"request id {request_id!r} is already in use")
        self.validate(prompt_ids, params)
        arrival = self.clock() if arrival_time is None else arrival_time
        request = Request(request_id, client_id, prompt_ids, params, arrival_time=arrival)
        reason = self.scheduler.add(request, request.arrival_time)
        if reason is not None:
            raise RequestRejected(reason, kind="rate_limited")
        self.requests[request_id] = request
        if self.tokenizer is not None:
            self.detokenizers[request_id] = self.tokenizer.detokenizer(prompt_ids)
        return request

    def step(self) -> list[StepOutput]:
        """Admit what fits, run one forward pass over the running batch, retire what finished.
        One `StepOutput` per request that ran: its new token and the text that token completed.
        """
        ran, _ = self.advance()
        return [self.output_or_fail(r) for r in ran]

    def advance(self) -> tuple[list[Request], list[Request]]:
        """`step()` without the StepOutputs: the requests that ran and those that finished.

        The simulator calls this: it makes millions of tokens and reads none of them, and
        building a StepOutput per token would cost it a tenth of its time."""
        if not self.running or self.steps_since_admission + 1 >= self.admit_every:
            before = len(self.running)
            self.scheduler.schedule(self.admit)
            if len(self.running) > before:
                self.steps_since_admission = -1  # a failed try leaves it due: retry every step
        self.steps_since_admission += 1
        if not self.running:
            return [], []
        self.num_steps += 1
        ran = list(self.running)  # retire() takes finished requests out of self.running
        if self.reservation == "peak":
            for r in ran:  # this step writes K/V for positions < num_tokens
                self.allocator.grow(r.request_id, len(r.prompt_ids) + len(r.output_ids))
        try:
            tokens = self.runner.run(ran, self.allocator)
        except RequestFailed as e:  # one request's own sampling: nobody else's state moved,
            self.fail(e.request, e.cause)  # and the rest of the batch runs this step again
            self.retire(e.request)
            self.check_shared_state()
            return [e.request], [e.request]
        failed = False
        for r, token in zip(ran, tokens, strict=True):
            try:
                self.append(r, token)
            except Exception as e:  # its detokenizer, its stop rule: that request's fault alone
                self.fail(r, e)
                failed = True
        self.scheduler.on_decode(ran)  # charge the step's tokens: one call per step
        # (finish_reason, set by finish(), rather than status: an Enum read costs ~100 ns here)
        finished = [r for r in ran if r.finish_reason is not None]
        for r in finished:
            self.retire(r)
        if failed:
            self.check_shared_state()
        if self.check_invariants:
            self.check()
        elif self.check_fairness:
            self.scheduler.check_invariants()
        return ran, finished

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

    def fail(self, request: Request, cause: BaseException) -> None:
        """A fault in `request`'s own work: it ends with reason "error" (retired by the caller),
        and the error says why, for the client. Everyone else is served on."""
        request.status, request.finish_reason = Status.ABORTED, "error"
        request.error = f"{type(cause).__name__}: {cause}"
        request.finish_time = self.clock()

    def check_shared_state(self) -> None:
        """After a request failed: the pool and the scheduler must still be sound. If they are
        not, this raises, and whoever runs the engine must stop (it cannot be trusted)."""
        self.allocator.check_invariants()
        self.scheduler.check_invariants()

    def forget_idle_clients(self) -> dict[str, ClientTokens]:
        """Drop what the engine and the policy keep about clients with nothing waiting or
        running, where the policy says that changes no decision (`Scheduler.forget`); return
        the forgotten clients' token counts (a server sums them into its totals)."""
        busy = {r.client_id for r in self.requests.values()}
        known = set(self.client_tokens) | set(self.scheduler.accounts())
        idle = sorted(known - busy)
        gone = self.scheduler.forget(idle, self.clock())
        return {c: self.client_tokens.pop(c, ClientTokens()) for c in gone}

    def has_unfinished(self) -> bool:
        # Called every step: ask for one waiting request, not for a count of them all.
        return bool(self.running) or next(iter(self.scheduler.waiting()), None) is not None

    def check(self) -> None:
        self.allocator.check_invariants()
        self.scheduler.check_invariants()
        held = set(self.allocator.block_tables)
        assert held == {r.request_id for r in self.running}, (
            f"blocks held by {sorted(held)} but running {[r.request_id for r in self.running]}"
        )
        assert all(r.status is Status.RUNNING for r in self.running)
        if self.reservation == "peak":
            final = sum(self.allocator.blocks_needed(r.max_num_tokens - 1) for r in self.running)
            assert self.final_blocks == final, f"final_blocks {self.final_blocks} != {final}"
            spans = {r.request_id: self.span(r) for r in self.running}
            assert self.spans == spans, f"spans {self.spans} != {spans}: a request fell behind"

    # --- helpers -------------------------------------------------------------------------------

    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestRejected("this engine has no tokenizer: pass token ids")
            return self.tokenizer.encode(prompt)
        return prompt if isinstance(prompt, list) else list(prompt)  # never mutated: no copy

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        total = len(prompt_ids) + params.max_tokens
        if not prompt_ids:
            raise RequestRejected(
                "the prompt is empty: it needs at least one token", param="prompt"
            )
        # Blame the prompt when it alone leaves no room for one output token, else max_tokens.
        limit = min(self.max_positions, self.allocator.num_tokens)
        param = "prompt" if len(prompt_ids) >= limit else "max_tokens"
        if error := context_error(len(prompt_ids), params.max_tokens, self.max_positions):
            raise RequestRejected(error, param=param)
        if not self.allocator.blocks_needed(total) <= self.allocator.num_blocks:
            raise RequestRejected(
                f"prompt + max_tokens = {total} tokens can never fit in the KV pool of "
                f"{self.allocator.num_tokens} tokens",
                param=param,
            )

    def admit(self, request: Request) -> bool:
        """The scheduler's `admit` callback: reserve the request's blocks if they fit."""
        if len(self.running) >= self.max_running:
            return False
        if self.reservation == "full":
            if not self.allocator.can_allocate(request.max_num_tokens):
                return False
            self.allocator.allocate(request.request_id, request.max_num_tokens)
        else:
            # Fast path: if every running request plus this one fit at their final lengths,
            # the peak fits too (it is at most that sum); only a tight pool needs the peak.
            final = self.allocator.blocks_needed(request.max_num_tokens - 1)
            if self.final_blocks + final > self.allocator.num_blocks:
                if self.peak_blocks(request) > self.allocator.num_blocks:
                    return False
            self.allocator.allocate(request.request_id, request.num_tokens)
            self.final_blocks += final
            self.spans[request.request_id] = self.span(request)
        request.status, request.admitted_time = Status.RUNNING, self.clock()
        self.running.append(request)
        # The prompt is charged at dispatch, before the next pick (Algorithm 2, Footnote 5).
        self.charge_prompt(request, request.num_prompt - request.num_computed)
        return True

    def peak_blocks(self, candidate: Request) -> int:
        """Most blocks the running batch plus `candidate` will ever hold (the official artifact's
        admission check; lessons/artifact_deviations.md).

        During step T a request holds base + T - 1 positions, up to its last step (`span`).
        Usage only grows between finishes, so the peak is at some request's last step: with
        requests sorted by last step, latest first, at the k-th one's last step the first k
        are running (every later one has finished).
        """
        spans = [*self.spans.values(), self.span(candidate)]
        spans.sort(reverse=True)  # latest last step first (the order of ties leaves the max alone)
        if self.allocator.block_size == 1:  # blocks == tokens: a running sum, O(n)
            peak, held = 0, 0
            for k, (last_k, base) in enumerate(spans, start=1):
                held += base
                if held + k * (last_k - 1) > peak:  # (not max(): this runs every step)
                    peak = held + k * (last_k - 1)
            return peak
        blocks = self.allocator.blocks_needed
        return max(
            sum(blocks(base + last_k - 1) for _, base in spans[: k + 1])
            for k, (last_k, _) in enumerate(spans)
        )

    def span(self, request: Request) -> tuple[int, int]:
        """(last, base) for a request about to run: with n tokens and s steps left, the coming
        step (T = num_steps + 1) writes K/V for positions < n, and each step after for one
        more, so during step T it holds n + (T - num_steps) - 1 = base + T - 1 positions, with
        base = n - num_steps, until its last step, last = num_steps + s. Both stay fixed while
        it runs (one token per step), so the engine computes them once, at admission."""
        left = request.params.max_tokens - len(request.output_ids)
        tokens = len(request.prompt_ids) + len(request.output_ids)
        return self.num_steps + left, tokens - self.num_steps

    def append(self, request: Request, token: int) -> None:
        """Give `request` its new token; finish it if that token ends it."""
        # Everything before `token` is in the pool. (len(), not the num_tokens property, here and
        # in the engine's other per-token lines: a property call costs more than the addition.)
        request.num_computed = len(request.prompt_ids) + len(request.output_ids)
        request.output_ids.append(token)
        if request.first_token_time is None:
            request.first_token_time = self.clock()
        self.client_tokens[request.client_id].num_output += 1  # made by charge_prompt
        detok = self.detokenizers.get(request.request_id)
        if detok is not None:  # (None: token ids only, as in the simulator: no text)
            request.text += detok.add(token)
        reason = stop_reason(token, len(request.output_ids), request.text, request.params,
                             self.eos_id)  # fmt: skip
        if reason:
            self.finish(request, reason)

    def output_or_fail(self, request: Request) -> StepOutput:
        """`output(request)`; if releasing its text fails, the request fails (alone)."""
        try:
            return self.output(request)
        except Exception as e:
            self.fail(request, e)
            if request in self.running:
                self.retire(request)
            return self.output(request)

    def output(self, request: Request) -> StepOutput:
        """What the last step gave `request`: its token, and the text it may release now (held
        back while it could still turn out to be the start of a stop sequence)."""
        last = request.output_ids[-1] if request.output_ids else -1
        if request.finish_reason == "error":
            return StepOutput(request.request_id, last, "", True, "error", request.error)
        finished = request.finish_reason is not None
        upto = releasable(request.text, request.params.stop, finished=finished)
        delta = request.text[request.num_text_sent : max(upto, request.num_text_sent)]
        request.num_text_sent += len(delta)
        return StepOutput(request.request_id, request.output_ids[-1], delta, finished,
                          request.finish_reason)  # fmt: skip

    def finish(self, request: Request, reason: str) -> None:
        """Mark finished; flush held-back text and cut the stop sequence off the text."""
        request.status, request.finish_reason = Status.FINISHED, reason
        request.finish_time = self.clock()
        detok = self.detokenizers.get(request.request_id)
        if detok is not None:
            request.text += detok.flush()
        if reason == "stop":
            request.text = trim_stop(request.text, request.params.stop)

    def charge_prompt(self, request: Request, num_prompt: int) -> None:
        """Count an admitted request's prompt (output tokens are counted in `append`)."""
        tokens = self.client_tokens.get(request.client_id)
        if tokens is None:  # (not setdefault: that would build a ClientTokens every request)
            tokens = self.client_tokens[request.client_id] = ClientTokens()
        tokens.num_input += num_prompt
        self.scheduler.on_tokens(request, num_prompt, 0)

    def retire(self, request: Request) -> None:
        self.running.remove(request)
        if self.reservation == "peak":
            self.final_blocks -= self.allocator.blocks_needed(request.max_num_tokens - 1)
            del self.spans[request.request_id]
        self.allocator.free(request.request_id)
        self.scheduler.on_finish(request)
        self.forget(request)

    def forget(self, request: Request) -> None:
        self.runner.release(request)
        self.requests.pop(request.request_id, None)
        self.detokenizers.pop(request.request_id, None)
