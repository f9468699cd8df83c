"""The plain generation loop: one prompt, a contiguous KV cache, one token at a time.

Owns the simplest correct way to generate — prefill the prompt, then feed back one token per
step — and the stop rules every generation path shares (`stop_reason`). The engine
(`engine.py`) does the same for many requests at once over a paged pool; the tests check the two
give the same greedy tokens. Lesson 1 teaches it.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from minivtc.attention import ContiguousAttention
from minivtc.model import Llama
from minivtc.sampler import SamplingParams, sample


@torch.inference_mode()
def generate_plain(model: Llama, prompt_ids: list[int], params: SamplingParams) -> Iterator[int]:
    """Yield generated token ids until EOS (unless ignore_eos) or max_tokens.

    Stop *sequences* are text, so the caller checks them on the decoded stream (`stop_reason`).
    """
    config = model.config
    if not prompt_ids:
        raise ValueError("the prompt must contain at least one token")
    if error := context_error(len(prompt_ids), params.max_tokens, config.max_positions):
        raise ValueError(error)
    total = len(prompt_ids) + params.max_tokens
    device, dtype = model.embed_tokens.weight.device, model.embed_tokens.weight.dtype
    cache = ContiguousAttention(
        config.n_layers, 1, total, config.n_kv_heads, config.head_dim, dtype, device
    )
    generator = params.generator()
    tokens = torch.tensor(prompt_ids, device=device)  # (T,)
    positions = torch.arange(len(prompt_ids), device=device)  # (T,)
    for _ in range(params.max_tokens):
        cache.set_step(torch.zeros_like(positions), positions)
        logits = model(tokens, positions, cache, logit_rows=positions[-1:] - positions[0])  # (1, V)
        token = sample(logits, [params], [generator])[0]
        yield token
        if token == config.eos_id and not params.ignore_eos:
            return
        tokens = torch.tensor([token], device=device)  # (1,)
        positions = positions[-1:] + 1  # (1,)


def context_error(num_prompt: int, max_tokens: int, max_positions: int) -> str | None:
    """Why a request cannot fit the model's context window (None if it can)."""
    total = num_prompt + max_tokens
    if total <= max_positions:
        return None
    return (
        f"prompt ({num_prompt} tokens) + max_tokens ({max_tokens}) = {total} "
        f"exceeds the model's context of {max_positions} positions"
    )


def stop_reason(
    token: int, num_generated: int, text: str, params: SamplingParams, eos_id: int
) -> str | None:
    """Why generation ends after this token: "eos", "length", "stop", or None to go on.

    `text` is everything generated so far; a stop sequence ends generation as soon as it appears
    (the caller trims it from the text it returns, as OpenAI's API does).
    """
    if token == eos_id and not params.ignore_eos:
        return "eos"
    if params.stop and any(s in text for s in params.stop):
        return "stop"
    if num_generated >= params.max_tokens:
        return "length"
    return None


def trim_stop(text: str, stop: tuple[str, ...]) -> str:
    """The text up to (not including) the earliest stop sequence in it."""
    cut = min((text.find(s) for s in stop if s in text), default=len(text))
    return text[:cut]


def releasable(text: str, stop: tuple[str, ...], finished: bool) -> int:
    """How much of `text` may be shown: all of it once finished, else all but a tail that
    could still grow into a stop sequence (so text that a stop sequence will cut is never
    streamed first)."""
    if finished:
        return len(text)
    return len(text) - max((len(s) - 1 for s in stop), default=0)
