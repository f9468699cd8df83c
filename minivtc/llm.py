"""The offline API, as vLLM spells it: `LLM(...).generate(prompts, SamplingParams(...))`.

Owns: `build_engine` (model + pool + runner + scheduler wired together with sensible defaults)
and `LLM`, which feeds prompts through the engine's continuous batching and returns the results
in prompt order, shaped like vLLM's (`llm_outputs.py`); `LLM.chat` does the same for
conversations. The prompt forms it reads are `llm_inputs.py`'s, vLLM's constructor arguments
`llm_args.py`'s. Streaming users (the server) call the engine directly: `add_request` / `step`
/ `abort`. Lesson 3 teaches it.

`n` samples of a prompt are `n` engine requests of the same client, each charged as a request
of its own: the prompt once per sample (each sample prefills it: the work is done `n` times;
with the prefix cache a sample that finds the prompt cached pays w_c for it), and every
sample's own tokens. A list of prompts is as many requests. So `n` or a list buys no place in
the queue that as many separate requests would not: the scheduler orders them as it would any.
"""

from __future__ import annotations

import inspect
import random
import time
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from minivtc.core.chat import prompt_ids
from minivtc.core.engine import Engine
from minivtc.core.kv_pool import BlockAllocator, KVPool
from minivtc.core.model import Llama
from minivtc.core.options import EngineOptions
from minivtc.core.params import MAX_SEED
from minivtc.core.policies import make_scheduler
from minivtc.core.prefix_cache import PrefixCachingAllocator
from minivtc.core.request import Request
from minivtc.core.runner import ModelRunner
from minivtc.core.sampler import SamplingParams
from minivtc.core.scheduler import Scheduler
from minivtc.core.tokenizer import Tokenizer
from minivtc.core.weights import bundled_weights_dir, load_model
from minivtc.llm_args import VLLMArgs, check_known, resolve_dtype
from minivtc.llm_inputs import Prompt, Sample, plan
from minivtc.llm_outputs import CompletionOutput, RequestOutput, request_output

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams", "build_engine"]
# vLLM's constructor arguments that LLM takes through **engine_options (`llm_args.VLLMArgs`)
VLLM_ONLY = (
    "enforce_eager",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "quantization",
    "trust_remote_code",
    "swap_space",
    "disable_log_stats",
    "tokenizer_mode",
    "kv_cache_dtype",
)

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
    max_model_len: int | None = None,
    clock: Callable[[], float] = time.monotonic,
    options: EngineOptions | None = None,
    **engine_options: Any,
) -> Engine:
    """An engine over `model`. The pool holds `kv_tokens` tokens, or fills `kv_bytes` bytes.

    `scheduler` is a policy name (`scheduler.SCHEDULERS`) or object; `client_weights` are the
    operator's per-client shares for the VTC family (never taken from requests).
    `prefix_caching`: requests that share a prompt prefix share its cached KV blocks and skip
    its prefill (`prefix_cache.py`). `max_model_len` caps prompt + max_tokens below the model's
    context (vLLM's name).

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
        max_positions=context_positions(model.config.max_positions, max_model_len),
        eos_id=model.config.eos_id,
        tokenizer=tokenizer,
        clock=clock,
        options=options,
    )


# minivtc's own keywords LLM passes on: build_engine's, and the EngineOptions it builds
ENGINE_KEYWORDS = {
    *inspect.signature(build_engine).parameters,
    *(f.name for f in fields(EngineOptions)),
} - {"model", "tokenizer", "engine_options"}


def context_positions(model_positions: int, max_model_len: int | None) -> int:
    if max_model_len is None:
        return model_positions
    if max_model_len > model_positions:
        raise ValueError(
            f"max_model_len={max_model_len} is more than the model's context ({model_positions})"
        )
    return max_model_len


class LLM:
    """Load a model once, then `generate` batches of prompts with continuous batching.

    `model` is the checkpoint directory (vLLM's name); `weights_dir` is minivtc's older name for
    it and still works. Neither means the bundled model. vLLM's other arguments are read as
    `llm_args.VLLMArgs` says (those with no meaning here are an error); minivtc's own
    (`scheduler`, `kv_tokens`, `reservation`, ...) go to `build_engine`. After loading,
    `self.model` is the `Llama` module itself.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        dtype: str | torch.dtype = "auto",
        device: str = "cpu",
        weights_dir: str | Path | None = None,
        tokenizer: str | Path | None = None,
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        enable_prefix_caching: bool | None = None,
        gpu_memory_utilization: float | None = None,
        seed: int | None = None,
        **engine_options: Any,
    ) -> None:
        check_known(set(engine_options), ENGINE_KEYWORDS | set(VLLM_ONLY))
        args = VLLMArgs(
            tokenizer=tokenizer,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            enable_prefix_caching=enable_prefix_caching,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            **{k: engine_options.pop(k) for k in VLLM_ONLY if k in engine_options},
        )
        checkpoint = checkpoint_dir(model, weights_dir)
        root = Path(checkpoint) if checkpoint is not None else bundled_weights_dir()
        args.check_tokenizer(root)
        auto = "cuda" if torch.cuda.is_available() else "cpu"
        where = torch.device(auto if device == "auto" else device)
        llama, self.tokenizer = load_model(root, resolve_dtype(dtype, root, where), str(where))
        self.model = llama
        extra = args.engine_keywords(where)
        self.engine = build_engine(llama, self.tokenizer, **(extra | engine_options))
        self.seeds = random.Random(seed) if seed is not None else None

    @torch.inference_mode()
    def generate(
        self,
        prompts: Any,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        use_tqdm: bool | Callable = True,
        lora_request: Any = None,
    ) -> list[RequestOutput]:
        """Every prompt (vLLM's forms: `llm_inputs.py`) to completion; outputs in prompt
        order. Everything is checked before anything is queued: a ValueError leaves the `LLM`
        as it was."""
        if lora_request is not None:
            raise ValueError("lora_request: LoRA adapters are not supported")
        parsed, _, samples = plan(self.engine, prompts, sampling_params, SamplingParams())
        requests = self.queue(parsed, samples)
        self.run(requests, use_tqdm)
        by_prompt: list[list[Request]] = [[] for _ in parsed]
        for sample, request in zip(samples, requests, strict=True):
            by_prompt[sample.prompt_index].append(request)
        return [
            request_output(p, rs, self.tokenizer) for p, rs in zip(parsed, by_prompt, strict=True)
        ]

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        use_tqdm: bool | Callable = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        lora_request: Any = None,
    ) -> list[RequestOutput]:
        """vLLM's `chat`: one conversation (a list of messages) or a list of them, each through
        the Llama-2 chat format or `chat_template` (`chat.py`), then `generate`."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        if not isinstance(conversations, list) or not conversations:
            raise ValueError("messages must be a conversation (a list of messages) or a list")
        prompts = [
            {
                "prompt_token_ids": prompt_ids(
                    self.tokenizer, list(c), chat_template, add_generation_prompt
                )
            }
            for c in conversations
        ]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, lora_request=lora_request)

    def get_tokenizer(self) -> Tokenizer:
        """The tokenizer, with Hugging Face's common surface (`encode`, `decode`,
        `eos_token_id`, `bos_token_id`, `apply_chat_template`, calling it)."""
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        return SamplingParams()

    def queue(self, prompts: list[Prompt], samples: list[Sample]) -> list[Request]:
        """Queue every sample (all checked already); the seed a run's `seed` gives those that
        have none. A refusal the checks cannot foresee (a rate limit) takes back the rest."""
        requests: list[Request] = []
        try:
            for s in samples:
                params = s.params
                if self.seeds is not None and params.seed is None:
                    params = replace(params, seed=self.seeds.randrange(MAX_SEED))
                prompt = prompts[s.prompt_index]
                requests.append(
                    self.engine.add_request(prompt.ids, params, cache_salt=prompt.cache_salt)
                )
        except Exception:
            for r in requests:  # all or nothing: no half-queued batch
                self.engine.abort(r.request_id)
            raise
        return requests

    def run(self, requests: list[Request], use_tqdm: bool | Callable) -> None:
        """Step the engine until `requests` are done (a bar on a terminal, as vLLM's)."""
        bar_of = use_tqdm if callable(use_tqdm) else tqdm
        bar = bar_of(total=len(requests), desc="generating", disable=None if use_tqdm else True)
        done = 0
        while self.engine.has_unfinished():
            self.engine.step()
            now = sum(r.is_finished for r in requests)
            bar.update(now - done)
            done = now
        bar.close()


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
