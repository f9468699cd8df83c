"""Log-probabilities a request asked for (`logprobs`, `prompt_logprobs`), as vLLM returns them.

Owns `Logprob` (vLLM's: the value, its rank, the token's text) and reading them off a forward
pass: `record_sampled` after each sampled token, `record_prompt` for the prompt positions a
prefill computed. They are of the model's own distribution, log_softmax of the logits before
penalties, temperature and the top-k/top-p cuts (vLLM's default, "raw_logprobs"), so a greedy
request's logprobs equal `transformers`' scores. The runner calls these; the request keeps
plain Python values (`Request.logprobs`). Shape legend: N rows, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from minivtc.requests.request import Request

__all__ = ["Logprob", "record_prompt", "record_sampled"]


@dataclass(frozen=True)
class Logprob:
    logprob: float
    rank: int  # 1 for the most likely token
    decoded_token: str | None = None  # filled in by the front door, which has the tokenizer


def record_sampled(logits: Tensor, requests: list[Request], tokens: list[int | Exception]) -> None:
    """Each request that asked for `logprobs`: the sampled token's logprob (and the running
    sum) and the top `logprobs` of the distribution it was drawn from (rows of `logits`)."""
    for row, (r, token) in enumerate(zip(requests, tokens, strict=True)):
        if r.params.logprobs is None or isinstance(token, Exception):
            continue
        lp = torch.log_softmax(logits[row].float(), dim=-1)  # (V,)
        if r.logprobs is None:
            r.logprobs = []
        r.logprobs.append(top_logprobs(lp, r.params.logprobs, token))
        r.cumulative_logprob = (r.cumulative_logprob or 0.0) + float(lp[token])


def record_prompt(logits: Tensor, request: Request, start: int) -> None:
    """Prompt logprobs from a prefill: row j of `logits` predicted prompt position start + j + 1
    (position 0 has none: nothing precedes it; positions a prefix cache held have none)."""
    if request.prompt_logprobs is None:
        request.prompt_logprobs = [None] * (start + 1)
    lp = torch.log_softmax(logits.float(), dim=-1)  # (rows, V)
    k = request.params.prompt_logprobs
    assert k is not None, "asked for by a request with prompt_logprobs only"
    for j in range(lp.shape[0]):
        token = request.prompt_ids[start + j + 1]
        request.prompt_logprobs.append(top_logprobs(lp[j], k, token))


def top_logprobs(lp: Tensor, k: int, chosen: int) -> dict[int, Logprob]:
    """The chosen token's entry first, then the k most likely (vLLM's order)."""
    rank = int((lp > lp[chosen]).sum()) + 1
    entries = {chosen: Logprob(float(lp[chosen]), rank)}
    if k:
        values, ids = lp.topk(k)
        for j, (v, t) in enumerate(zip(values.tolist(), ids.tolist(), strict=True)):
            entries.setdefault(t, Logprob(v, j + 1))
    return entries
