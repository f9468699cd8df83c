"""The offline API, modeled on vLLM: `LLM(...).generate(prompts, SamplingParams(...))`.

Owns: `build_engine` (model + pool + runner + scheduler wired together with sensible defaults)
and `LLM`, which feeds a list of prompts through the engine's continuous batching and returns
the results in prompt order. Streaming users (the server) call the engine directly:
`add_request` / `step` / `abort`. Lesson 3 teaches it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minivtc.engine import Engine
from minivtc.kv_pool import KVPool
from minivtc.model import Llama
from minivtc.runner import ModelRunner
from minivtc.sampler import SamplingParams
from minivtc.scheduler import Scheduler, make_scheduler
from minivtc.tokenizer import Tokenizer
from minivtc.weights import load_model

DEFAULT_KV_TOKENS = 10000  # the paper's pool (PAPER.md §3.1)


def build_engine(
    model: Llama,
    tokenizer: Tokenizer | None,
    scheduler: str | Scheduler = "fcfs",
    kv_tokens: int | None = None,
    kv_bytes: int | None = None,
    block_size: int = 16,
    compile_attention: bool | None = None,
    client_weights: dict[str, float] | None = None,
    **engine_options,
) -> Engine:
    """An engine over `model`. The pool holds `kv_tokens` tokens, or fills `kv_bytes` bytes.

    `scheduler` is a policy name (`scheduler.SCHEDULERS`) or object; `client_weights` are the
    operator's per-client shares for the VTC family (never taken from requests).

    `compile_attention=None` means on for CUDA, off for CPU (compiling costs more than it saves
    on a laptop CPU). Other keywords go to `Engine` (max_running, check_invariants, clock).
    """
    if kv_tokens is not None and kv_bytes is not None:
        raise ValueError("give kv_tokens or kv_bytes, not both")
    weight = model.embed_tokens.weight
    pool_options = {"dtype": weight.dtype, "device": weight.device}
    if kv_bytes is not None:
        pool = KVPool.from_bytes(model.config, kv_bytes, block_size, **pool_options)
    else:
        pool = KVPool.from_tokens(
            model.config, kv_tokens or DEFAULT_KV_TOKENS, block_size, **pool_options
        )
    if compile_attention is None:
        compile_attention = weight.device.type == "cuda"
    if isinstance(scheduler, str):
        policy = make_scheduler(scheduler, weights=client_weights)
    else:
        policy = scheduler
    return Engine(
        runner=ModelRunner(model, pool, compile_attention), allocator=pool.allocator,
        scheduler=policy, max_positions=model.config.max_positions,
        eos_id=model.config.eos_id, tokenizer=tokenizer, **engine_options,
    )  # fmt: skip


@dataclass(frozen=True)
class CompletionOutput:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str


class LLM:
    """Load a model once, then `generate` batches of prompts with continuous batching."""

    def __init__(
        self, weights_dir: str | None = None, dtype: str = "fp32", device: str = "cpu",
        **engine_options,
    ) -> None:  # fmt: skip
        model, tokenizer = load_model(weights_dir, dtype, device)
        self.model, self.tokenizer = model, tokenizer
        self.engine = build_engine(model, tokenizer, **engine_options)

    @torch.inference_mode()
    def generate(
        self, prompts: str | list[str] | list[list[int]], params: SamplingParams | None = None
    ) -> list[CompletionOutput]:
        """Every prompt (text or token ids) to completion; outputs in prompt order."""
        params = params or SamplingParams()
        prompts = [prompts] if isinstance(prompts, str) else prompts
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
        return [
            CompletionOutput(r.prompt_ids, r.output_ids, r.text, r.finish_reason or "")
            for r in requests
        ]
