"""vLLM's `LLM(...)` constructor arguments, read as minivtc's: what each means here, and a clear
error for those that mean nothing for a one-device Llama-2 engine.

Owns `VLLMArgs` (the arguments as vLLM spells them, checked) and `check_known`. The rules it
shares with `minivtc serve`'s vLLM flags (`serving/vllm_flags.py`) live below both: the dtype's
("auto" and vLLM's names: `model/weights.resolve_dtype`) and `gpu_memory_utilization`'s (the KV
pool sized from the device's free memory, on CUDA: `engine/kv_pool.pool_bytes`). `LLM`
(`llm.py`) builds the engine from them. Lesson 3.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from minivtc.engine.kv_pool import pool_bytes

__all__ = ["VLLMArgs", "check_known"]


@dataclass(frozen=True)
class VLLMArgs:
    """vLLM's arguments that have a meaning here (None: not given)."""

    tokenizer: str | Path | None = None  # must be the model directory: its tokenizer.model
    max_model_len: int | None = None  # caps prompt + max_tokens below the model's context
    max_num_seqs: int | None = None  # the batch's most requests (EngineConfig.max_running)
    enable_prefix_caching: bool | None = None
    gpu_memory_utilization: float | None = None  # CUDA: the share of the device this may use
    seed: int | None = None  # seeds the requests given no seed: a run is reproducible
    enforce_eager: bool = False  # no torch.compile of attention (minivtc has no CUDA graphs)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    quantization: str | None = None
    trust_remote_code: bool = False  # nothing of a checkpoint's is ever run: means nothing
    swap_space: float | None = None  # vLLM's CPU swap GiB; preemption="swap" holds host copies
    disable_log_stats: bool = True  # minivtc logs no stats either way
    tokenizer_mode: str = "auto"  # the SentencePiece tokenizer is the only one
    kv_cache_dtype: str = "auto"  # the KV pool has the weights' dtype

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            if getattr(self, name) != 1:
                raise ValueError(f"{name}={getattr(self, name)}: minivtc runs on one device")
        if self.quantization is not None:
            raise ValueError(f"quantization={self.quantization!r} is not supported")
        for name in ("tokenizer_mode", "kv_cache_dtype"):
            if getattr(self, name) != "auto":
                raise ValueError(f"{name}={getattr(self, name)!r}: only 'auto' here")
        util = self.gpu_memory_utilization
        if util is not None and not 0 < util <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {util}")

    def engine_keywords(self, device: torch.device) -> dict:
        """build_engine's keywords for these (only those given)."""
        out: dict = {}
        if self.max_model_len is not None:
            out["max_model_len"] = self.max_model_len
        if self.max_num_seqs is not None:
            out["max_running"] = self.max_num_seqs
        if self.enable_prefix_caching is not None:
            out["prefix_caching"] = self.enable_prefix_caching
        if self.enforce_eager:
            out["compile_attention"] = False
        if self.gpu_memory_utilization is not None and device.type == "cuda":
            out["kv_bytes"] = pool_bytes(self.gpu_memory_utilization, device)
        return out

    def check_tokenizer(self, checkpoint: Path) -> None:
        if self.tokenizer is not None and Path(self.tokenizer).resolve() != checkpoint.resolve():
            raise ValueError(
                f"tokenizer={str(self.tokenizer)!r}: minivtc reads the tokenizer.model of the "
                "model directory; give no tokenizer, or the model directory"
            )


# vLLM's arguments for what minivtc does not do: each refused with its reason
UNSUPPORTED = {
    "max_num_batched_tokens": "chunked prefill is not supported: a step prefills whole prompts",
    "enable_chunked_prefill": "chunked prefill is not supported: a step prefills whole prompts",
    "enable_lora": "LoRA adapters are not supported",
    "speculative_config": "speculative decoding is not supported",
    "cpu_offload_gb": "weights are not offloaded: they live on the device",
    "task": "only generation is supported",
}


def check_known(given: set[str], known: set[str]) -> None:
    """Refuse, before loading anything, an argument that means nothing here, naming why."""
    for name in sorted(given - known):
        why = UNSUPPORTED.get(name, "not a vLLM argument minivtc reads, nor one of its own")
        raise ValueError(f"LLM({name}=...): {why}")
