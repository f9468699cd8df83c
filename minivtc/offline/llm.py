"""The offline API, as vLLM spells it: `LLM(...).generate(prompts, SamplingParams(...))`.

Owns `LLM` (its engine is `engine.factory.build_engine`'s, from an `EngineConfig` of its
keywords, `engine/engine_config.py`), which feeds prompts through the engine's continuous
batching and returns the results in prompt order, shaped like vLLM's (`outputs.py`); `LLM.chat`
does the same for conversations. The prompt forms it reads are `inputs.py`'s, vLLM's
constructor arguments `args.py`'s. Streaming users (the server) call the engine directly:
`add_request` / `step` / `abort`. Lesson 3 teaches it.

`n` samples of a prompt are `n` engine requests of the same client, each charged as a request
of its own: the prompt once per sample (each sample prefills it: the work is done `n` times;
with the prefix cache a sample that finds the prompt cached pays w_c for it), and every
sample's own tokens. A list of prompts is as many requests. So `n` or a list buys no place in
the queue that as many separate requests would not: the scheduler orders them as it would any.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from minivtc.engine.engine_config import CONFIG_FIELDS
from minivtc.engine.factory import build_engine
from minivtc.engine.sampler import SamplingParams
from minivtc.model.chat import prompt_ids
from minivtc.model.packed import packs_on
from minivtc.model.tokenizer import Tokenizer
from minivtc.model.weights import bundled_weights_dir, load_model, resolve_dtype
from minivtc.offline.args import VLLMArgs, check_known
from minivtc.offline.inputs import Prompt, Sample, plan
from minivtc.offline.outputs import CompletionOutput, RequestOutput, request_output
from minivtc.requests.params import MAX_SEED
from minivtc.requests.request import Request

__all__ = ["CompletionOutput", "ENGINE_KEYWORDS", "LLM", "RequestOutput", "SamplingParams"]
__all__ += ["build_engine"]
# vLLM's constructor arguments that LLM takes through **engine_options (`llm_args.VLLMArgs`)
VLLM_ONLY = (
    "max_num_seqs",
    "enable_prefix_caching",
    "gpu_memory_utilization",
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


# minivtc's own keywords LLM passes on to build_engine: the EngineConfig's fields, and the clock
ENGINE_KEYWORDS = {*CONFIG_FIELDS, "clock"}


class LLM:
    """Load a model once, then `generate` batches of prompts with continuous batching.

    `model` is the checkpoint directory (vLLM's name); `weights_dir` is minivtc's older name for
    it and still works. Neither means the bundled model. vLLM's other arguments are read as
    `llm_args.VLLMArgs` says (those with no meaning here are an error); minivtc's own
    (`EngineConfig`'s fields: `policy`, `kv_tokens`, `reservation`, ...) go to `build_engine`.
    After loading, `self.model` is the `Llama` module itself.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        dtype: str | torch.dtype = "auto",
        device: str = "cpu",
        weights_dir: str | Path | None = None,
        tokenizer: str | Path | None = None,
        max_model_len: int | None = None,
        seed: int | None = None,
        **engine_options: Any,
    ) -> None:
        check_known(set(engine_options), ENGINE_KEYWORDS | set(VLLM_ONLY))
        args = VLLMArgs(
            tokenizer=tokenizer,
            max_model_len=max_model_len,
            seed=seed,
            **{k: engine_options.pop(k) for k in VLLM_ONLY if k in engine_options},
        )
        checkpoint = checkpoint_dir(model, weights_dir)
        root = Path(checkpoint) if checkpoint is not None else bundled_weights_dir()
        args.check_tokenizer(root)
        auto = "cuda" if torch.cuda.is_available() else "cpu"
        where = torch.device(auto if device == "auto" else device)
        torch_dtype: torch.dtype = resolve_dtype(dtype, root, where)
        llama, self.tokenizer = load_model(
            root, torch_dtype, str(where), packed=packs_on(where, torch_dtype)
        )
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
        """Every prompt (vLLM's forms: `inputs.py`) to completion; outputs in prompt
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
