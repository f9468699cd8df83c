"""The checks before a request is queued: its prompt as token ids, and whether it can ever run
here. Owns `RequestRejected`, the one error `Engine.add_request` raises for a request it
refuses (nothing else is disturbed); the server turns it into an HTTP error body.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minivtc.core.kv_pool import BlockAllocator
from minivtc.core.params import SamplingParams, context_error

if TYPE_CHECKING:
    from minivtc.core.tokenizer import Tokenizer


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
    if isinstance(prompt, str):
        if tokenizer is None:
            raise RequestRejected("this engine has no tokenizer: pass token ids")
        return tokenizer.encode(prompt)
    return prompt if isinstance(prompt, list) else list(prompt)  # never mutated: no copy


def validate(
    prompt_ids: list[int],
    params: SamplingParams,
    max_positions: int,
    max_model_len: int,
    allocator: BlockAllocator,
) -> None:
    """Refuse a request that can never run: an empty prompt, one past the model's context, or
    one whose prompt + max_tokens could never fit in the KV pool (`max_model_len`: the
    smaller of the two, `Engine.max_model_len`)."""
    total = len(prompt_ids) + params.max_tokens
    if not prompt_ids:
        raise RequestRejected(
            "the prompt is empty: it needs one token at least", "invalid", "prompt"
        )
    # Blame the prompt when it alone leaves no room for one output token, else max_tokens.
    param = "prompt" if len(prompt_ids) >= max_model_len else "max_tokens"
    if error := context_error(len(prompt_ids), params.max_tokens, max_positions):
        raise RequestRejected(error, param=param)
    if not allocator.blocks_needed(total) <= allocator.num_blocks:
        raise RequestRejected(
            f"prompt + max_tokens = {total} tokens can never fit in the KV pool of "
            f"{allocator.num_tokens} tokens",
            param=param,
        )
