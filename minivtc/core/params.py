"""What a caller may ask of a generation, and when a generation ends: plain Python, no tensors.

Owns: `SamplingParams` (vLLM's names, validated) and the stop rules every generation path
shares: `context_error` (can it fit the context at all), `stop_reason` (does this token end
it: EOS, max_tokens, a stop sequence), `trim_stop` and `releasable` (what text may be shown).
The scheduler, the simulator and the server's schemas import this without importing torch;
the sampling itself is `sampler.py`'s. Lessons 1 and 3.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

MAX_SEED = 2**63 - 1


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
        if not 0 <= self.temperature < float("inf"):  # (NaN fails this too)
            raise ValueError(f"temperature must be >= 0 and finite, got {self.temperature}")
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
        import torch  # only here: the policy layer imports SamplingParams without torch

        gen = torch.Generator()
        gen.manual_seed(self.seed if self.seed is not None else torch.seed())
        return gen


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
