"""What a request's own history does to its next-token logits: penalties, and `min_tokens`.

Owns `penalize`, applied to the logits before sampling (greedy too: a penalty can change the
argmax), in vLLM's order:

- `repetition_penalty` r (Keskar et al. 2019, as `transformers`' RepetitionPenaltyLogitsProcessor):
  every token already in the prompt or the output has its logit divided by r if positive,
  multiplied by r if negative (r > 1 makes it less likely either way);
- `frequency_penalty` f and `presence_penalty` p (OpenAI's definitions): a token the output
  holds c times loses f * c + p * (c > 0) from its logit (prompt tokens are not counted);
- before `min_tokens` outputs, EOS and `stop_token_ids` cannot be sampled (their logits -inf).

Rows of requests that ask for none of these are untouched (no copy). Does not own the sampling
(`sampler.py`) or the logprobs, which read the model's logits before any of this
(`logprobs.py`). Shape legend: N rows (one per request), V vocabulary, U distinct tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request

__all__ = ["penalize", "penalize_row"]


def penalize(logits: Tensor, requests: list[Request], eos_id: int) -> Tensor:
    """The (N, V) logits with each request's penalties and min_tokens mask applied."""
    rows = [i for i, r in enumerate(requests) if needs_processing(r)]
    if not rows:
        return logits
    logits = logits.float().clone()  # (N, V): the caller's logits stay as the model gave them
    for i in rows:
        r = requests[i]
        logits[i] = penalize_row(logits[i], r.prompt_ids, r.output_ids, r.params)
        if r.num_output < r.params.min_tokens:
            banned = list(r.params.stop_token_ids) + ([] if r.params.ignore_eos else [eos_id])
            logits[i, banned] = -float("inf")
    return logits


def needs_processing(request: Request) -> bool:
    return request.params.penalized or request.num_output < request.params.min_tokens


def penalize_row(
    logits: Tensor, prompt_ids: list[int], output_ids: list[int], p: SamplingParams
) -> Tensor:
    """One row (V,) with the repetition, frequency and presence penalties applied."""
    if p.repetition_penalty != 1:
        seen = torch.tensor(sorted(set(prompt_ids) | set(output_ids)), device=logits.device)  # (U,)
        score = logits[seen]  # (U,)
        score = torch.where(score < 0, score * p.repetition_penalty, score / p.repetition_penalty)
        # A tiny r (1e-300 is > 0, so allowed) makes score / r overflow to inf, and sampling
        # from inf is NaN: kept at the largest finite logit, the seen tokens still win
        big = torch.finfo(score.dtype).max
        logits = logits.scatter(0, seen, score.clamp(-big, big))  # (V,)
    if output_ids and (p.frequency_penalty or p.presence_penalty):
        ids = torch.tensor(output_ids, device=logits.device)
        counts = torch.bincount(ids, minlength=logits.numel()).to(logits.dtype)  # (V,)
        logits = logits - p.frequency_penalty * counts - p.presence_penalty * (counts > 0)
    return logits
