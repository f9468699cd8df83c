"""`build_engine`: the one place an engine is put together from a model and a policy.

Owns the choices every caller would otherwise repeat: the pool's size (in tokens or in bytes)
and its allocator (blocks, or blocks that share cached prefixes), whether attention is
compiled, the policy by name (`fairness.policies`) or as an object, and the context a request
may use. The server, the simulator's calibration, the benchmarks, the coursework and the
vLLM-style `LLM` (`offline/llm.py`) all build their engine here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from minivtc.engine.engine import Engine
from minivtc.engine.kv_pool import BlockAllocator, KVPool
from minivtc.engine.options import EngineOptions
from minivtc.engine.prefix_cache import PrefixCachingAllocator
from minivtc.engine.runner import ModelRunner
from minivtc.fairness.policies import make_scheduler
from minivtc.fairness.scheduler import Scheduler
from minivtc.model.llama import Llama
from minivtc.model.tokenizer import Tokenizer

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


def context_positions(model_positions: int, max_model_len: int | None) -> int:
    if max_model_len is None:
        return model_positions
    if max_model_len > model_positions:
        raise ValueError(
            f"max_model_len={max_model_len} is more than the model's context ({model_positions})"
        )
    return max_model_len
