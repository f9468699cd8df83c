"""The prompts and sampling params `LLM.generate` takes, in vLLM's forms, all checked before
anything is queued.

Owns `Sample` (one engine request to make: its prompt's token ids and one sample's params) and
`plan`, which reads:

- prompts: a string, or a list of strings; a list of token ids (one prompt), or a list of such
  lists; vLLM's dicts, `{"prompt": text}` (TextPrompt) and `{"prompt_token_ids": ids}`
  (TokensPrompt), each with an optional `"cache_salt"`; `multi_modal_data` and the like are
  refused by name (a Llama-2 engine reads text);
- sampling params: one `SamplingParams` for every prompt, or a list of one per prompt;
- `n`: a prompt asked for `n` samples becomes `n` requests (seeds `seed`, `seed + 1`, ...).

Every prompt is tokenized and every sample checked as `Engine.add_request` would check it (ids
in the vocabulary, prompt + max_tokens within the context and the pool) before the first is
queued, so a bad prompt anywhere in a batch raises `ValueError` and leaves the engine as it
was. Lesson 3.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from minivtc.engine.engine import Engine
from minivtc.engine.intake import checked_params, encode
from minivtc.requests.params import SamplingParams

__all__ = ["Prompt", "Sample", "plan"]

PROMPT_KEYS = {"prompt", "prompt_token_ids", "cache_salt"}


@dataclass(frozen=True)
class Prompt:
    text: str | None  # None when given as token ids, as in vLLM
    ids: list[int]
    cache_salt: str | None = None


@dataclass(frozen=True)
class Sample:
    prompt_index: int
    index: int  # which of the prompt's n samples (vLLM's CompletionOutput.index)
    params: SamplingParams  # n=1, max_tokens resolved


def plan(
    engine: Engine, prompts: Any, sampling_params: Any, default: SamplingParams
) -> tuple[list[Prompt], list[SamplingParams], list[Sample]]:
    """The prompts, each prompt's params and the samples to queue; ValueError if any is bad."""
    parsed = [read_prompt(p, engine) for p in prompt_list(prompts)]
    params = params_list(sampling_params, len(parsed), default)
    samples = []
    for i, (prompt, p) in enumerate(zip(parsed, params, strict=True)):
        for k in range(p.n):
            one = checked_params(prompt.ids, p.sample(k), engine.max_positions, engine.allocator)
            samples.append(Sample(i, k, one))
    return parsed, params, samples


def prompt_list(prompts: Any) -> list[Any]:
    """vLLM's batch forms as a list of single prompts."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, Sequence) and prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]  # one prompt of token ids (bools are refused as ids later)
    if isinstance(prompts, Sequence):
        return list(prompts)
    raise ValueError(
        "prompts must be a string, a list of token ids, a vLLM prompt dict or a list of these, "
        f"got {type(prompts).__name__}"
    )


def read_prompt(prompt: Any, engine: Engine) -> Prompt:
    if isinstance(prompt, dict):
        return read_prompt_dict(prompt, engine)
    ids = encode(prompt, engine.tokenizer)  # RequestRejected (a ValueError) if it is no prompt
    return Prompt(prompt if isinstance(prompt, str) else None, list(ids))


def read_prompt_dict(prompt: dict, engine: Engine) -> Prompt:
    """vLLM's TextPrompt or TokensPrompt."""
    unknown = set(prompt) - PROMPT_KEYS
    if unknown:
        raise ValueError(
            f"prompt keys {sorted(unknown)} are not supported (a Llama-2 engine reads text or "
            f"token ids: {sorted(PROMPT_KEYS)})"
        )
    if ("prompt" in prompt) == ("prompt_token_ids" in prompt):
        raise ValueError("a prompt dict needs one of 'prompt' (text) or 'prompt_token_ids'")
    salt = prompt.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise ValueError(f"cache_salt must be a string, got {salt!r}")
    if "prompt" in prompt:
        if not isinstance(prompt["prompt"], str):
            raise ValueError(f"'prompt' must be a string, got {type(prompt['prompt']).__name__}")
        return Prompt(prompt["prompt"], encode(prompt["prompt"], engine.tokenizer), salt)
    ids = prompt["prompt_token_ids"]
    if isinstance(ids, str):
        raise ValueError("'prompt_token_ids' must be a list of token ids, not a string")
    return Prompt(None, list(encode(ids, engine.tokenizer)), salt)


def params_list(sampling_params: Any, count: int, default: SamplingParams) -> list[SamplingParams]:
    """One SamplingParams per prompt: the same for all, or the caller's list of one each."""
    if sampling_params is None:
        return [default] * count
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * count
    if isinstance(sampling_params, Sequence) and not isinstance(sampling_params, str):
        if len(sampling_params) != count:
            raise ValueError(
                f"{len(sampling_params)} SamplingParams for {count} prompts: give one, or one "
                "per prompt"
            )
        if all(isinstance(p, SamplingParams) for p in sampling_params):
            return list(sampling_params)
    raise ValueError("sampling_params must be a SamplingParams or a list of one per prompt")
