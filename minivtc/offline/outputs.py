"""What `LLM.generate` returns, shaped as vLLM's: `RequestOutput` holding `CompletionOutput`s.

Owns the output types and `request_output`, which reads them off finished engine requests.
Names and meanings are vLLM's: `finish_reason` is "stop" (EOS, a stop string or a stop token)
or "length" ("abort" and "error" are minivtc's, for a request the engine ended); `stop_reason`
is the stop string or token id that ended it (None for EOS and length); `logprobs` is one
`{token id: Logprob}` per output token when asked for, `cumulative_logprob` their sum; times in
`metrics` are the engine clock's (`time.monotonic` seconds). Lesson 3.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import cast

from minivtc.engine.sampler import Logprob
from minivtc.model.tokenizer import Tokenizer
from minivtc.offline.inputs import Prompt
from minivtc.requests.request import Request

__all__ = ["CompletionOutput", "RequestOutput", "completion", "request_output"]

FINISH_REASONS = {"eos": "stop"}  # the engine's word -> vLLM's (the others are the same)


@dataclass(frozen=True)
class CompletionOutput:
    """One completion (sample) of a prompt, as vLLM's."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None
    stop_reason: str | int | None = None


@dataclass(frozen=True)
class RequestMetrics:
    """vLLM's `RequestOutput.metrics`, of the prompt's first sample to finish last."""

    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float | None
    time_in_queue: float | None


@dataclass(frozen=True)
class RequestOutput:
    """A prompt and its completions, as vLLM's `RequestOutput`. `text`, `token_ids` and
    `finish_reason` are minivtc's shorthand for `outputs[0]`'s."""

    request_id: str
    prompt: str | None  # None when the prompt was given as token ids, as in vLLM
    prompt_token_ids: list[int]
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache (vLLM's name)

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason


def request_output(
    prompt: Prompt, requests: list[Request], tokenizer: Tokenizer | None
) -> RequestOutput:
    """The output of one prompt from its samples' finished requests (index order)."""
    first = requests[0]
    return RequestOutput(
        request_id=first.request_id,
        prompt=prompt.text,
        prompt_token_ids=list(first.prompt_ids),
        prompt_logprobs=decoded(first.prompt_logprobs, tokenizer),
        outputs=[completion(k, r, tokenizer) for k, r in enumerate(requests)],
        finished=all(r.is_finished for r in requests),
        metrics=metrics(requests),
        num_cached_tokens=first.num_cached,
    )


def completion(index: int, r: Request, tokenizer: Tokenizer | None) -> CompletionOutput:
    # copies: the outputs must not change if the engine ever touches the request again
    return CompletionOutput(
        index=index,
        text=r.text,
        token_ids=list(r.output_ids),
        cumulative_logprob=r.cumulative_logprob,
        logprobs=cast("list[dict[int, Logprob]] | None", decoded(r.logprobs, tokenizer)),
        finish_reason=finish_reason(r.finish_reason),
        stop_reason=r.stop_reason,
    )


def metrics(requests: list[Request]) -> RequestMetrics:
    first, last = requests[0], max(requests, key=lambda r: r.finish_time or 0.0)
    scheduled = [r.admitted_time for r in requests if r.admitted_time is not None]
    tokens = [r.first_token_time for r in requests if r.first_token_time is not None]
    start = min(scheduled, default=None)
    return RequestMetrics(
        arrival_time=first.arrival_time,
        first_scheduled_time=start,
        first_token_time=min(tokens, default=None),
        finished_time=last.finish_time,
        time_in_queue=None if start is None else start - first.arrival_time,
    )


def finish_reason(reason: str | None) -> str | None:
    """vLLM's word for the engine's finish reason ("stop" for an EOS too)."""
    return reason if reason is None else FINISH_REASONS.get(reason, reason)


def decoded(
    positions: Sequence[dict[int, Logprob] | None] | None, tokenizer: Tokenizer | None
) -> list[dict[int, Logprob] | None] | None:
    """Logprobs with each token's text filled in (the runner has no tokenizer)."""
    if positions is None or tokenizer is None:
        return None if positions is None else list(positions)
    piece = tokenizer.token_text
    return [
        None
        if entry is None
        else {t: replace(lp, decoded_token=piece(t)) for t, lp in entry.items()}
        for entry in positions
    ]
