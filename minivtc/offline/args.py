"""vLLM's `LLM(...)` constructor arguments, read as minivtc's: what each means here, and a clear
error for those that mean nothing for a one-device Llama-2 engine.

Owns `VLLMArgs` (the arguments as vLLM spells them, checked), `resolve_dtype` ("auto" and vLLM's
dtype names) and `pool_bytes` (`gpu_memory_utilization`: the KV pool sized from the device's free
memory, on CUDA). `LLM` (`llm.py`) builds the engine from them. Lesson 3.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from minivtc.model.weights import DTYPES, load_config

__all__ = ["VLLMArgs", "check_known", "pool_bytes", "resolve_dtype"]

DTYPE_NAMES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16"}
DTYPE_NAMES |= {"bfloat16": "bf16"} | {name: name for name in DTYPES}  # vLLM's, and minivtc's
HF_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


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


def resolve_dtype(dtype: str | torch.dtype, checkpoint: Path, device: torch.device):
    """A dtype for the weights: minivtc's and vLLM's names; "auto" is the checkpoint's own
    (`torch_dtype` in config.json), except fp16 on a CPU, which runs as fp32."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        hf = load_config_dtype(checkpoint)
        name = HF_DTYPES.get(hf, "fp32") if hf is not None else "fp32"
        return DTYPES["fp32" if name == "fp16" and device.type == "cpu" else name]
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype!r}; choose 'auto' or one of {sorted(DTYPE_NAMES)}")
    return DTYPES[DTYPE_NAMES[dtype]]


def load_config_dtype(checkpoint: Path) -> str | None:
    import json

    load_config(checkpoint)  # the usual errors for a directory that is no checkpoint
    return json.loads((checkpoint / "config.json").read_text()).get("torch_dtype")


def pool_bytes(utilization: float, device: torch.device) -> int:
    """vLLM's rule: this process may use `utilization` of the device's memory; the KV pool
    gets what that leaves after everything already allocated on it (the weights, and other
    processes'), less a margin for the activations of a step."""
    free, total = torch.cuda.mem_get_info(device)
    budget = int(utilization * total) - (total - free)
    margin = total // 20  # a step's activations (not measured per model: a fixed 5%)
    if budget - margin <= 0:
        raise ValueError(
            f"gpu_memory_utilization={utilization}: {total - free} of {total} bytes are already "
            "in use, which leaves no room for the KV pool"
        )
    return budget - margin
