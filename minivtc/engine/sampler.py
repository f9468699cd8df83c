"""From a step's logits to each request's next token: what its own history does to them, then
the draw (greedy, temperature, top-k, top-p, min-p), each request seeded.

Owns `penalize` and `sample()` (what a caller may ask for, `SamplingParams`, is `params.py`'s).
The runner calls them in vLLM's order:

1. `penalize`, applied to the logits before sampling (greedy too: a penalty can change the
   argmax):

   - `repetition_penalty` r (Keskar et al. 2019, as `transformers`'
     RepetitionPenaltyLogitsProcessor): every token already in the prompt or the output has
     its logit divided by r if positive, multiplied by r if negative (r > 1 makes it less
     likely either way);
   - `frequency_penalty` f and `presence_penalty` p (OpenAI's definitions): a token the output
     holds c times loses f * c + p * (c > 0) from its logit (prompt tokens are not counted);
   - before `min_tokens` outputs, EOS and `stop_token_ids` cannot be sampled (their logits
     -inf).

   Rows of requests that ask for none of these are untouched (no copy).
2. `sample`: greedy rows are one batched argmax; sampled rows each draw from their own
   `torch.Generator`, so a request's tokens depend on its seed alone, never on which other
   requests share its batch.

Does not own: stop conditions (the engine), the model, or the logprobs, which read the
model's logits before any of this (`logprobs.py`). Lesson 1 teaches it.

Shape legend: N rows (one per request that needs a token), V vocabulary, U distinct tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minivtc.requests.params import SamplingParams as SamplingParams  # re-exported: vLLM's home
from minivtc.requests.request import Request

__all__ = ["SamplingParams", "min_p_filter", "penalize", "penalize_row", "sample", "sample_each"]
__all__ += ["sample_row", "top_p_filter"]


class SamplingFailed(RuntimeError):
    """Sampling row `row` of the logits failed; `tokens` holds the rows sampled before it."""

    def __init__(self, row: int, cause: Exception, tokens: list[int]) -> None:
        super().__init__(f"sampling row {row} failed: {cause!r}")
        self.row, self.cause, self.tokens = row, cause, tokens


def sample(
    logits: Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int]:
    """One token id per row of `logits` (N, V). Raises `SamplingFailed` naming the row at fault,
    so the engine can fail that request alone."""
    logits = logits.float()  # (N, V)
    tokens = logits.argmax(dim=-1).tolist()  # greedy for every row; sampled rows overwrite
    for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
        if not p.greedy:
            try:
                tokens[row] = sample_row(logits[row], p, gen)
            except Exception as e:
                raise SamplingFailed(row, e, tokens[:row]) from e
    return tokens


def sample_each(
    logits: Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int | Exception]:
    """`sample`, except that a row whose sampling fails gets its exception in place of a token
    and the rows after it are still sampled (each request's draws stay its own)."""
    out: list[int | Exception] = []
    start = 0
    while start < len(params):
        try:
            out += sample(logits[start:], params[start:], generators[start:])
            break
        except SamplingFailed as e:
            out += [*e.tokens, e.cause]
            start += e.row + 1
    return out


def sample_row(logits: Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
    # Shift so the largest logit is 0, in float64: with a tiny temperature (1e-40 is valid
    # input) float32 logits / T overflow to inf, or T itself rounds to 0, and softmax gives
    # NaN; shifted, the others go to -inf and the distribution is the argmax, as it should be.
    logits = logits.cpu().double()  # (V,)
    probs = torch.softmax((logits - logits.max()) / p.temperature, dim=-1)  # (V,)
    if p.top_k > 0:  # (0 and vLLM's -1: no cut)
        kth = torch.topk(probs, min(p.top_k, probs.numel())).values[-1]
        probs = torch.where(probs >= kth, probs, 0.0)  # (V,)
    if p.top_p < 1:
        probs = top_p_filter(probs, p.top_p)  # (V,)
    if p.min_p > 0:
        probs = min_p_filter(probs, p.min_p)  # (V,)
    return int(torch.multinomial(probs / probs.sum(), 1, generator=gen))


def top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches `top_p` (nucleus)."""
    sorted_probs, order = probs.sort(descending=True)  # (V,)
    mass_before = sorted_probs.cumsum(0) - sorted_probs  # (V,) mass of strictly likelier tokens
    sorted_probs[mass_before >= top_p] = 0.0  # the most likely token always survives
    return torch.zeros_like(probs).scatter(0, order, sorted_probs)  # (V,)


def min_p_filter(probs: Tensor, min_p: float) -> Tensor:
    """Keep the tokens at least `min_p` times as likely as the likeliest (Nguyen et al., 2024:
    the cut scales with the model's confidence)."""
    return torch.where(probs >= min_p * probs.max(), probs, 0.0)  # (V,)


# --- what a request's own history does to its logits (before the draw) ---------------------------


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
