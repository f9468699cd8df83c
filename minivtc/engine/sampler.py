"""Next-token choice from logits: greedy, temperature, top-k, top-p, min-p, each request seeded.

Owns: `sample()` (what a caller may ask for, `SamplingParams`, is `params.py`'s). Greedy rows are
one batched argmax; sampled rows each draw from their own `torch.Generator`, so a request's
tokens depend on its seed alone, never on which other requests share its batch. Does not own:
stop conditions (the engine) or the model. Lesson 1 teaches it.

Shape legend: N rows (one per request that needs a token), V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

from minivtc.requests.params import SamplingParams as SamplingParams  # re-exported: vLLM's home

__all__ = ["SamplingParams", "min_p_filter", "sample", "sample_each", "sample_row", "top_p_filter"]


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
