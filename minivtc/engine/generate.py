"""The plain generation loop: one prompt, a contiguous KV cache, one token at a time.

Owns the simplest correct way to generate — prefill the prompt, then feed back one token per
step; the stop rules every generation path shares are `params.py`'s. The engine
(`engine.py`) does the same for many requests at once over a paged pool; the tests check the two
give the same greedy tokens. Lesson 1 teaches it.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from minivtc.engine.sampler import sample
from minivtc.model.attention import ContiguousAttention
from minivtc.model.llama import Llama
from minivtc.requests.params import SamplingParams, context_error

__all__ = ["generate_plain"]


@torch.inference_mode()
def generate_plain(model: Llama, prompt_ids: list[int], params: SamplingParams) -> Iterator[int]:
    """Yield generated token ids until EOS (unless ignore_eos) or max_tokens.

    Stop *sequences* are text, so the caller checks them on the decoded stream (`stop_reason`).
    """
    config = model.config
    if not prompt_ids:
        raise ValueError("the prompt must contain at least one token")
    if error := context_error(len(prompt_ids), params.limit, config.max_positions):
        raise ValueError(error)
    total = len(prompt_ids) + params.limit
    device, dtype = model.embed_tokens.weight.device, model.embed_tokens.weight.dtype
    cache = ContiguousAttention(
        config.n_layers, 1, total, config.n_kv_heads, config.head_dim, dtype, device
    )
    generator = params.generator()
    tokens = torch.tensor(prompt_ids, device=device)  # (T,)
    positions = torch.arange(len(prompt_ids), device=device)  # (T,)
    for _ in range(params.limit):
        cache.set_step(torch.zeros_like(positions), positions)
        logits = model(tokens, positions, cache, logit_rows=positions[-1:] - positions[0])  # (1, V)
        token = sample(logits, [params], [generator])[0]
        yield token
        if token == config.eos_id and not params.ignore_eos:
            return
        tokens = torch.tensor([token], device=device)  # (1,)
        positions = positions[-1:] + 1  # (1,)
