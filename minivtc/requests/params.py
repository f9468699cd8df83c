"""What a caller may ask of a generation, and when a generation ends: plain Python, no tensors.

Owns: `SamplingParams` (vLLM's names, validated) and the stop rules every generation path
shares: `context_error` (can it fit the context at all), `stop_reason` (does this token end
it: EOS, max_tokens, a stop sequence), `trim_stop` and `releasable` (what text may be shown).
The scheduler, the simulator and the server's schemas import this without importing torch;
the sampling itself is `sampler.py`'s. Lessons 1 and 3.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

__all__ = ["DEFAULT_MAX_TOKENS", "MAX_LOGPROBS", "MAX_SEED", "ParamError", "SamplingParams"]
__all__ += ["context_error", "cut_stop", "releasable", "resolve_max_tokens", "stop_reason"]
__all__ += ["trim_stop"]

if TYPE_CHECKING:
    import torch

MAX_SEED = 2**63 - 1
MAX_LOGPROBS = 20  # vLLM's default max_logprobs
DEFAULT_MAX_TOKENS = 16  # vLLM's SamplingParams default, and OpenAI's for a completion


@dataclass(frozen=True)
class SamplingParams:
    """vLLM's names and defaults. temperature 0 is greedy; max_tokens counts generated tokens
    (None: as many as the context leaves, `resolve_max_tokens`); top_k 0 or -1 is no cut.

    Penalties follow vLLM: `repetition_penalty` (Keskar et al., as `transformers`' processor:
    on every prompt and output token) and the OpenAI `presence_penalty` / `frequency_penalty`
    (on output tokens only), applied to the logits before everything else (`sampler.penalize`).
    `logprobs` / `prompt_logprobs` ask for that many top log-probabilities per position, of the
    model's own distribution (before penalties and temperature, vLLM's default "raw"), plus the
    chosen token's. `n` samples are `n` requests of one client (`offline/llm.py`: how they are
    charged).
    """

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = no top-k cut
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    min_tokens: int = 0  # EOS, stop tokens and stop strings cannot end it before this many
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        check_types(self)
        check_ranges(self)

    @property
    def limit(self) -> int:
        """max_tokens, resolved: every request an engine holds has one (`with_max_tokens`)."""
        assert self.max_tokens is not None, "max_tokens None is resolved when a request is added"
        return self.max_tokens

    def with_max_tokens(self, room: int) -> SamplingParams:
        """These params with max_tokens resolved (`resolve_max_tokens`; `room`: what the
        context leaves after the prompt)."""
        if self.max_tokens is not None:
            return self
        return replace(self, max_tokens=resolve_max_tokens(None, room))

    def sample(self, k: int) -> SamplingParams:
        """Sample k of these params' n, as one request of its own: n=1 and, seeded, the seed
        seed + k (vLLM's), so each sample differs and each run repeats."""
        seed = None if self.seed is None else (self.seed + k) % (MAX_SEED + 1)
        return replace(self, n=1, seed=seed) if self.n != 1 or k else self

    @property
    def penalized(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1)

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


INT_FIELDS = ("n", "top_k", "min_tokens")
OPTIONAL_INT_FIELDS = ("seed", "max_tokens", "logprobs", "prompt_logprobs")
FLOAT_FIELDS = (
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "temperature",
    "top_p",
    "min_p",
)
BOOL_FIELDS = ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output")


def is_int_value(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_finite(v: float) -> bool:
    return -float("inf") < v < float("inf")  # (NaN fails this too)


def check_types(p: SamplingParams) -> None:
    """Each field's type: a wrong one would fail later, inside a step, not here."""
    for name in INT_FIELDS + OPTIONAL_INT_FIELDS:
        v = getattr(p, name)
        if not (is_int_value(v) or (v is None and name in OPTIONAL_INT_FIELDS)):
            raise ValueError(f"{name} must be an int, got {v!r}")
    for name in FLOAT_FIELDS:
        v = getattr(p, name)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise ValueError(f"{name} must be a number, got {v!r}")
    for name in BOOL_FIELDS:
        if not isinstance(getattr(p, name), bool):
            raise ValueError(f"{name} must be True or False, got {getattr(p, name)!r}")
    if not all(isinstance(s, str) and s for s in p.stop):
        raise ValueError("stop sequences must be non-empty strings")
    if not all(is_int_value(t) and t >= 0 for t in p.stop_token_ids):
        raise ValueError(f"stop_token_ids must be token ids, got {list(p.stop_token_ids)}")


class ParamError(ValueError):
    """A sampling param out of its range (`check_ranges`); `param` names it, for a server's
    400 (`prompts.sampling_params`)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def check_ranges(p: SamplingParams) -> None:
    """Each field's range, and min_tokens <= max_tokens: the one place these are checked."""
    rules = [
        (p.n >= 1, "n", f"n must be >= 1, got {p.n}"),
        (
            0 <= p.temperature and is_finite(p.temperature),
            "temperature",
            "temperature must be >= 0 and finite",
        ),
        (0 < p.top_p <= 1, "top_p", f"top_p must be in (0, 1], got {p.top_p}"),
        (p.top_k >= -1, "top_k", f"top_k must be -1 (off), 0 (off) or more, got {p.top_k}"),
        (0 <= p.min_p <= 1, "min_p", f"min_p must be in [0, 1], got {p.min_p}"),
        (-2 <= p.presence_penalty <= 2, "presence_penalty", "presence_penalty must be in [-2, 2]"),
        (
            -2 <= p.frequency_penalty <= 2,
            "frequency_penalty",
            "frequency_penalty must be in [-2, 2]",
        ),
        (
            0 < p.repetition_penalty and is_finite(p.repetition_penalty),
            "repetition_penalty",
            "repetition_penalty > 0",
        ),
        (
            p.max_tokens is None or p.max_tokens >= 1,
            "max_tokens",
            f"max_tokens must be >= 1, got {p.max_tokens}",
        ),
        (p.min_tokens >= 0, "min_tokens", f"min_tokens must be >= 0, got {p.min_tokens}"),
        (
            p.max_tokens is None or p.min_tokens <= p.max_tokens,
            "min_tokens",
            f"min_tokens must be <= max_tokens ({p.max_tokens})",
        ),
        (
            p.logprobs is None or 0 <= p.logprobs <= MAX_LOGPROBS,
            "logprobs",
            "logprobs must be in [0, 20]",
        ),
        (
            p.prompt_logprobs is None or 0 <= p.prompt_logprobs <= MAX_LOGPROBS,
            "prompt_logprobs",
            "prompt_logprobs",
        ),
        # torch.Generator.manual_seed takes 64 bits; vLLM asks for the same range.
        (
            p.seed is None or 0 <= p.seed <= MAX_SEED,
            "seed",
            f"seed must be in [0, 2**63 - 1], got {p.seed}",
        ),
    ]
    for ok, param, message in rules:
        if not ok:
            raise ParamError(param, message)


def resolve_max_tokens(max_tokens: int | None, room: int | None) -> int:
    """max_tokens as asked, or None resolved: to `room`, the tokens the context leaves after the
    prompt (vLLM's rule), at least one (a prompt that leaves none is refused by the context
    check, which names the prompt: `intake.check_context`); with no room (a completion, whose
    default OpenAI's API fixes whatever the prompt), to `DEFAULT_MAX_TOKENS`.

    The one place None is resolved. Its callers: `SamplingParams.with_max_tokens` (for the
    engine's intake, `intake.checked_params`, and `minivtc generate`, which sizes its pool for
    the request) and `serving/prompts.max_tokens_of` (for the server's routes, whose logprob
    volume check needs the number before the engine has it, and the gateway's, which books and
    charges the number before any backend sees the request)."""
    if max_tokens is not None:
        return max_tokens
    return DEFAULT_MAX_TOKENS if room is None else max(room, 1)


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
    (the caller trims it from the text it returns, as OpenAI's API does), a token of
    `stop_token_ids` as soon as it is sampled. Before `min_tokens` only the length can end it.
    """
    if num_generated >= params.min_tokens:
        if token == eos_id and not params.ignore_eos:
            return "eos"
        if token in params.stop_token_ids:
            return "stop"
        if params.stop and any(s in text for s in params.stop):
            return "stop"
    if num_generated >= params.limit:
        return "length"
    return None


def trim_stop(text: str, stop: tuple[str, ...]) -> str:
    """The text up to (not including) the earliest stop sequence in it."""
    cut = min((text.find(s) for s in stop if s in text), default=len(text))
    return text[:cut]


def cut_stop(
    text: str, before_last: str, last_token: int, params: SamplingParams
) -> tuple[str, str | int]:
    """A generation ended by "stop": the text to return and what stopped it (vLLM's
    `stop_reason`: the stop string, or the token id of `stop_token_ids`). The text ends before
    the earliest stop string, or after it with `include_stop_str_in_output`; a stop token's
    own text is dropped likewise (`before_last`: the text without the last token's), as vLLM
    does."""
    found = [(text.find(s), s) for s in params.stop if s in text]
    if not found:  # a stop token
        return (text if params.include_stop_str_in_output else before_last), last_token
    start, stop = min(found)
    end = start + len(stop) if params.include_stop_str_in_output else start
    return text[:end], stop


def releasable(text: str, stop: tuple[str, ...], finished: bool) -> int:
    """How much of `text` may be shown: all of it once finished, else all but a tail that
    could still grow into a stop sequence (so text that a stop sequence will cut is never
    streamed first)."""
    if finished:
        return len(text)
    return len(text) - max((len(s) - 1 for s in stop), default=0)
