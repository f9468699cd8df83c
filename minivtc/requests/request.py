"""A request: plain Python values that follow it from arrival to finish.

Owns: `Request` (prompt, output so far, sampling params, client, status, timestamps) and its
`Status` lifecycle; and the records the engine keeps of them: `StepOutput` (what one step did
for one request) and `ClientTokens` (the tokens processed for one client). No tensors: the
scheduler, the engine and the simulator all read requests, and a notebook prints one readably.
Lesson 3 teaches it.

Lifecycle::

    WAITING --admit--> RUNNING --eos/length/stop--> FINISHED
       ^                  |
       +----preempt-------+          (any state) --abort--> ABORTED
                          |
                          +--a fault in its own work--> ABORTED, finish_reason "error"

`num_computed` counts the tokens whose keys and values are in the pool. A step computes
`all_ids[num_computed:]`: the whole prompt after admission (prefill), one token afterwards
(decode); with a prefix cache, admission starts it at the cached prefix (`num_cached`).
Preemption (`Engine.preempt`) frees the blocks; by recompute it sets `num_computed = 0`, and the
next admission recomputes prompt + output so far, past what a prefix cache holds
(`preemption.py`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from minivtc.requests.params import SamplingParams, releasable

__all__ = ["ClientTokens", "Request", "Status", "StepOutput"]


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(repr=False, slots=True)  # slots: a simulation holds up to a million of them
class Request:
    request_id: str
    client_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival_time: float
    output_ids: list[int] = field(default_factory=list)
    text: str = ""  # generated text so far (empty when the engine runs without a tokenizer)
    num_text_sent: int = 0  # characters of `text` already handed out in StepOutputs
    status: Status = Status.WAITING
    num_computed: int = 0
    num_preemptions: int = 0  # times preempted (recomputed or swapped back); >0: charged already
    num_cached: int = 0  # prompt tokens found in the prefix cache when first admitted
    cache_salt: str | None = None  # shares cached prefixes only with requests of the same salt
    admitted_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    finish_reason: str | None = None  # "eos" | "length" | "stop" | "abort" | "error"
    error: str | None = None  # why serving this request failed (finish_reason "error")
    stop_reason: str | int | None = None  # finish_reason "stop": the stop string or token id
    # params.logprobs / prompt_logprobs: per position, token id -> Logprob (`sampler.py`),
    # written by the runner from the forward pass that sampled (or read) the token
    logprobs: list[dict[int, Any]] | None = None
    prompt_logprobs: list[dict[int, Any] | None] | None = None
    cumulative_logprob: float | None = None  # the sum of the sampled tokens' logprobs

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_output(self) -> int:
        return len(self.output_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def max_num_tokens(self) -> int:
        """Prompt + max_tokens: what admission reserves, so decode never runs out of blocks."""
        return len(self.prompt_ids) + self.params.limit

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def uncomputed_ids(self) -> list[int]:
        """The tokens the next step computes: the prompt after admission, then the last output."""
        if self.num_computed >= self.num_prompt:
            return self.output_ids[self.num_computed - self.num_prompt :]
        return self.all_ids[self.num_computed :]

    def end(self, status: Status, reason: str, now: float, error: str | None = None) -> None:
        """Finished (a stop rule's `reason`) or aborted ("abort", or "error" and why)."""
        self.status, self.finish_reason, self.finish_time, self.error = status, reason, now, error

    def fail(self, cause: BaseException, now: float) -> None:
        """A fault in its own work (its sampling, its text) ended it: "error", and why."""
        self.end(Status.ABORTED, "error", now, f"{type(cause).__name__}: {cause}")

    @property
    def is_finished(self) -> bool:
        return self.status in (Status.FINISHED, Status.ABORTED)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, client={self.client_id!r}, {self.status.value}, "
            f"prompt={self.num_prompt}, output={self.num_output}/{self.params.max_tokens}, "
            f"computed={self.num_computed}"
            + (f", cached={self.num_cached}" if self.num_cached else "")
            + ")"
        )


class StepOutput(NamedTuple):
    """What one step did for one request, as a server streams it: its token and the text that
    token completed (`Engine.output`)."""

    request_id: str
    token_id: int
    text_delta: str
    finished: bool
    finish_reason: str | None
    error: str | None = None  # finish_reason "error": what failed

    @classmethod
    def take(cls, request: Request) -> StepOutput:
        """What the last step gave `request`: its token, and the text it may release now (held
        back while it could still turn out to be the start of a stop sequence). Taking it
        hands that text out; it reads the request and changes nothing else."""
        last = request.output_ids[-1] if request.output_ids else -1
        if request.finish_reason == "error":
            return cls(request.request_id, last, "", True, "error", request.error)
        finished = request.finish_reason is not None
        upto = releasable(request.text, request.params.stop, finished)
        delta = request.text[request.num_text_sent : max(upto, request.num_text_sent)]
        request.num_text_sent += len(delta)
        return cls(request.request_id, last, delta, finished, request.finish_reason)


@dataclass
class ClientTokens:
    """Tokens the engine has processed for one client (the fairness layer's raw material)."""

    num_input: int = 0
    num_output: int = 0
    num_cached: int = 0  # of num_input, prompt tokens the prefix cache held

    def admit(self, request: Request, cached: int) -> None:
        """Count `request`'s prompt, of which `cached` tokens the prefix cache held."""
        self.num_input += request.num_prompt
        self.num_cached += cached
