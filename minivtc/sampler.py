"""Next-token choice from logits: greedy, temperature, top-k, top-p, each request seeded.

Owns: `SamplingParams` (what a caller may ask for, validated) and `sample()`. Greedy rows are
one batched argmax; sampled rows each draw from their own `torch.Generator`, so a request's
tokens depend on its seed alone, never on which other requests share its batch. Does not own:
stop conditions (the engine) or the model. Lesson 1 teaches it.

Shape legend: N rows (one per request that needs a token), V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

MAX_SEED = 2**63 - 1


class SamplingFailed(RuntimeError):
    """Sampling one row failed (`row` of the logits); the other rows are not at fault."""

    def __init__(self, row: int, cause: BaseException) -> None:
        super().__init__(f"sampling row {row} failed: {cause!r}")
        self.row, self.cause = row, cause


@dataclass(frozen=True)
class SamplingParams:
    """vLLM's names. temperature 0 is greedy; max_tokens counts generated tokens."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k cut
    max_tokens: int = 16
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if any(not s for s in self.stop):
            raise ValueError("stop sequences must be non-empty strings")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            # torch.Generator.manual_seed takes 64 bits; vLLM asks for the same range.
            raise ValueError(f"seed must be in [0, 2**63 - 1], got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generator(self) -> torch.Generator | None:
        """A fresh generator for one request (None for greedy: nothing random happens)."""
        if self.greedy:
            return None
        gen = torch.Generator()
        gen.manual_seed(self.seed if self.seed is not None else torch.seed())
        return gen


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
                raise SamplingFailed(row, e) from e
    return tokens


def sample_row(logits: Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
    # Shift so the largest logit is 0, in float64: with a tiny temperature (1e-40 is valid
    # input) float32 logits / T overflow to inf, or T itself rounds to 0, and softmax gives
    # NaN; shifted, the others go to -inf and the distribution is the argmax, as it should be.
    logits = logits.cpu().double()  # (V,)
    probs = torch.softmax((logits - logits.max()) / p.temperature, dim=-1)  # (V,)
    if p.top_k:
        kth = torch.topk(probs, min(p.top_k, probs.numel())).values[-1]
        probs = torch.where(probs >= kth, probs, 0.0)  # (V,)
    if p.top_p < 1:
        probs = top_p_filter(probs, p.top_p)  # (V,)
    return int(torch.multinomial(probs / probs.sum(), 1, generator=gen))


def top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches `top_p` (nucleus)."""
    sorted_probs, order = probs.sort(descending=True)  # (V,)
    mass_before = sorted_probs.cumsum(0) - sorted_probs  # (V,) mass of strictly likelier tokens
    sorted_probs[mass_before >= top_p] = 0.0  # the most likely token always survives
    return torch.zeros_like(probs).scatter(0, order, sorted_probs)  # (V,)
