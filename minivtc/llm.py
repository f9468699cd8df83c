"""The offline API, modeled on vLLM: `LLM(...).generate(prompts, SamplingParams(...))`.

Owns: `build_engine` (model + pool + runner + scheduler wired together with sensible defaults)
and `LLM`, which feeds a list of prompts through the engine's continuous batching and returns
the results in prompt order, shaped like vLLM's (`RequestOutput` holding `CompletionOutput`s).
Streaming users (the server) call the engine directly: `add_request` / `step` / `abort`.
Lesson 3 teaches it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from minivtc.core.engine import Engine
from minivtc.core.kv_pool import BlockAllocator, KVPool
from minivtc.core.model import Llama
from minivtc.core.options import EngineOptions
from minivtc.core.policies import make_scheduler
from minivtc.core.prefix_cache import PrefixCachingAllocator
from minivtc.core.request import Request
from minivtc.core.runner import ModelRunner
from minivtc.core.sampler import SamplingParams
from minivtc.core.scheduler import Scheduler
from minivtc.core.tokenizer import Tokenizer
from minivtc.core.weights import load_model

DEFAULT_KV_TOKENS = 10000  # the pool of the paper's A10G experiments (Section 5)


def build_engine(
    model: Llama,
    tokenizer: Tokenizer | None,
    scheduler: str | Scheduler = "fcfs",
    kv_tokens: int | None = None,
    kv_bytes: int | None = None,
    block_size: int = 16,
    compile_attention: bool | None = None,
    client_weights: dict[str, float] | None = None,
    prefix_caching: bool = False,
    clock: Callable[[], float] = time.monotonic,
    options: EngineOptions | None = None,
    **engine_options: Any,
) -> Engine:
    """An engine over `model`. The pool holds `kv_tokens` tokens, or fills `kv_bytes` bytes.

    `scheduler` is a policy name (`scheduler.SCHEDULERS`) or object; `client_weights` are the
    operator's per-client shares for the VTC family (never taken from requests).
    `prefix_caching`: requests that share a prompt prefix share its cached KV blocks and skip
    its prefill (`prefix_cache.py`).

    `compile_attention=None` means on for CUDA, off for CPU (compiling costs more than it saves
    on a laptop CPU). `options`, or the keywords that build them (`EngineOptions`: reservation,
    victim, max_running, check_invariants, ...), say how the engine admits and preempts.
    """
    if options is not None and engine_options:
        raise TypeError(f"give options or its keywords, not both: {sorted(engine_options)}")
    options = options or EngineOptions(**engine_options)
    if kv_tokens is not None and kv_bytes is not None:
        raise ValueError("give kv_tokens or kv_bytes, not both")
    weight = model.embed_tokens.weight
    pool_options = {
        "dtype": weight.dtype,
        "device": weight.device,
        "allocator": PrefixCachingAllocator if prefix_caching else BlockAllocator,
    }
    if kv_bytes is not None:
        pool = KVPool.from_bytes(model.config, kv_bytes, block_size, **pool_options)
    else:
        pool = KVPool.from_tokens(
            model.config,
            DEFAULT_KV_TOKENS if kv_tokens is None else kv_tokens,
            block_size,
            **pool_options,
        )
    if compile_attention is None:
        compile_attention = weight.device.type == "cuda"
    if isinstance(scheduler, str):
        policy = make_scheduler(scheduler, weights=client_weights)
    else:
        policy = scheduler
    return Engine(
        runner=ModelRunner(model, pool, compile_attention),
        allocator=pool.allocator,
        scheduler=policy,
        max_positions=model.config.max_positions,
        eos_id=model.config.eos_id,
        tokenizer=tokenizer,
        clock=clock,
        options=options,
    )


@dataclass(frozen=True)
class CompletionOutput:
    """One completion of a prompt, as in vLLM. `finish_reason` is the engine's word: "eos",
    "stop" (a stop string), "length" or "error"; vLLM says "stop" for both of the first two."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str


@dataclass(frozen=True)
class RequestOutput:
    """A prompt and its completions, as vLLM's `RequestOutput`. minivtc makes one completion per
    prompt, so `text`, `token_ids` and `finish_reason` are shorthand for `outputs[0]`'s."""

    request_id: str
    prompt: str | None  # None when the prompt was given as token ids, as in vLLM
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache (vLLM's name)

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str:
        return self.outputs[0].finish_reason


class LLM:
    """Load a model once, then `generate` batches of prompts with continuous batching.

    `model` is the checkpoint directory (vLLM's name); `weights_dir` is minivtc's older name for
    it and still works. Neither means the bundled model. After loading, `self.model` is the
    `Llama` module itself.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        dtype: str = "fp32",
        device: str = "cpu",
        weights_dir: str | Path | None = None,
        **engine_options: Any,
    ) -> None:
        checkpoint = checkpoint_dir(model, weights_dir)
        llama, tokenizer = load_model(checkpoint, dtype, device)
        self.model, self.tokenizer = llama, tokenizer
        self.engine = build_engine(llama, tokenizer, **engine_options)

    @torch.inference_mode()
    def generate(
        self, prompts: str | list[str] | list[list[int]], params: SamplingParams | None = None
    ) -> list[RequestOutput]:
        """Every prompt (text or token ids) to completion; outputs in prompt order."""
        params = params or SamplingParams()
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)  # zipped again below
        requests = []
        try:
            for p in prompts:
                requests.append(self.engine.add_request(p, params))
        except Exception:
            for r in requests:  # all or nothing: a bad prompt leaves no half-queued batch
                self.engine.abort(r.request_id)
            raise
        while self.engine.has_unfinished():
            self.engine.step()
        return [request_output(p, r) for p, r in zip(prompts, requests, strict=True)]


def checkpoint_dir(model: str | Path | None, weights_dir: str | Path | None) -> str | Path | None:
    """The one checkpoint directory named by `model` and/or `weights_dir` (None: the bundled)."""
    if model is None or weights_dir is None:
        return model if model is not None else weights_dir
    if Path(model).resolve() != Path(weights_dir).resolve():
        raise ValueError(
            f"LLM got model={str(model)!r} and weights_dir={str(weights_dir)!r}; "
            "they name the same thing (the checkpoint directory), so give one"
        )
    return model


def request_output(prompt: str | list[int], request: Request) -> RequestOutput:
    # copies: the outputs must not change if the engine ever touches the request again
    completion = CompletionOutput(
        0, request.text, list(request.output_ids), request.finish_reason or ""
    )
    return RequestOutput(
        request_id=request.request_id,
        prompt=prompt if isinstance(prompt, str) else None,
        prompt_token_ids=list(request.prompt_ids),
        outputs=[completion],
        finished=request.is_finished,
        num_cached_tokens=request.num_cached,
    )
