"""The checks before a request is queued: its prompt as token ids, its max_tokens resolved, and
whether it can ever run here. Owns `RequestRejected`, the one error `Engine.add_request` raises for
a request it refuses (nothing else is disturbed); the server turns it into an HTTP error body.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minivtc.engine.kv_pool import BlockAllocator
from minivtc.requests.params import SamplingParams, context_error

__all__ = ["RequestRejected", "check_context", "check_ids", "checked_params", "encode"]
__all__ += ["max_model_len"]

if TYPE_CHECKING:
    from minivtc.model.tokenizer import Tokenizer


class RequestRejected(ValueError):
    """`add_request` refused a request; nothing else was disturbed. `reason` says why.

    `kind` is "invalid" (can never run here: too long for the context or the pool) or
    "rate_limited" (the policy refused it now, e.g. RPM; the server answers 429).
    `param` names the request field at fault ("prompt" or "max_tokens"), for an HTTP error body.
    """

    def __init__(self, reason: str, kind: str = "invalid", param: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.kind, self.param = reason, kind, param


def encode(prompt: str | list[int], tokenizer: Tokenizer | None) -> list[int]:
    """The prompt as token ids: a text (tokenized with BOS) or a list of ids, each an int in the
    vocabulary. Anything else is refused here: an id the embedding cannot look up would fail
    the shared forward pass of every request in the step, not this request alone."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise RequestRejected("this engine has no tokenizer: pass token ids")
        return tokenizer.encode(prompt)
    if not isinstance(prompt, (list, tuple)):
        raise RequestRejected(
            f"a prompt is a string or a list of token ids, got {type(prompt).__name__}",
            param="prompt",
        )
    if tokenizer is not None:  # a real model (the simulator's ids index nothing)
        check_ids(prompt, tokenizer.vocab_size)
    return prompt if isinstance(prompt, list) else list(prompt)  # never mutated: no copy


def check_ids(ids: list[int] | tuple[int, ...], vocab_size: int) -> None:
    # bool is an int to Python, never a token id
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        bad = next(t for t in ids if not isinstance(t, int) or isinstance(t, bool))
        raise RequestRejected(f"token ids must be ints, got {bad!r}", param="prompt")
    if ids and not (0 <= min(ids) and max(ids) < vocab_size):
        raise RequestRejected(f"token ids must be in [0, {vocab_size})", param="prompt")


def checked_params(
    prompt_ids: list[int], params: SamplingParams, max_positions: int, allocator: BlockAllocator
) -> SamplingParams:
    """`params` for this prompt here: max_tokens None resolved to the room the context and the
    pool leave (`params.resolve_max_tokens`, the rule every front door uses), and the request
    refused if it can never run (`validate`). `Engine.add_request` and `LLM.generate`'s checks
    before queuing call it."""
    longest = max_model_len(max_positions, allocator)
    params = params.with_max_tokens(longest - len(prompt_ids))
    validate(prompt_ids, params, max_positions, longest)
    return params


def max_model_len(max_positions: int, allocator: BlockAllocator) -> int:
    """vLLM's name: the most positions one request can hold (the context, or the pool)."""
    return min(max_positions, allocator.num_tokens)


def validate(
    prompt_ids: list[int], params: SamplingParams, max_positions: int, max_model_len: int
) -> None:
    """Refuse a request that can never run: not one sample, an empty prompt, or one too long
    (`check_context`)."""
    if params.n != 1:  # the front doors (`LLM.generate`, the server) make n requests of one
        raise RequestRejected("an engine request is one sample: give n=1", param="n")
    if not prompt_ids:
        raise RequestRejected(
            "the prompt is empty: it needs one token at least", "invalid", "prompt"
        )
    check_context(len(prompt_ids), max_model_len, params.limit, max_positions)


def check_context(
    num_prompt: int,
    max_model_len: int,
    max_tokens: int | None = None,
    max_positions: int | None = None,
) -> None:
    """The context-length check, written once: a prompt alone (max_tokens None: the server's
    `/tokenize`, which generates nothing) may hold `max_model_len` tokens; a request, prompt +
    max_tokens, must fit the model's context (`max_positions`) and then `max_model_len`, the
    smaller of the context and the pool (past it but within the context, the pool is the
    smaller, and it never has the blocks)."""
    if max_tokens is None or max_positions is None:
        if num_prompt > max_model_len:
            raise RequestRejected(
                f"the prompt is {num_prompt} tokens: one request may hold {max_model_len}",
                param="prompt",
            )
        return
    # Blame the prompt when it alone leaves no room for one output token, else max_tokens.
    param = "prompt" if num_prompt >= max_model_len else "max_tokens"
    if error := context_error(num_prompt, max_tokens, max_positions):
        raise RequestRejected(error, param=param)
    total = num_prompt + max_tokens
    if total > max_model_len:  # within the context, so past the pool: it never has the blocks
        raise RequestRejected(
            f"prompt + max_tokens = {total} tokens can never fit in the KV pool of "
            f"{max_model_len} tokens",
            param=param,
        )
