"""`build_engine`: the one place an engine is put together from a model and a policy.

Owns what joins a spec (`spec.EngineSpec`: the policy, the pool, the options) to a model: the
pool's tensors on the model's device and dtype (its size in tokens, or in bytes), whether
attention is compiled, and the context a request may use. The server, the simulator's
calibration, the benchmarks, the coursework and the vLLM-style `LLM` (`offline/llm.py`) all
build their engine here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from minivtc.engine.engine import Engine
from minivtc.engine.kv_pool import KVPool
from minivtc.engine.runner import ModelRunner
from minivtc.engine.spec import EngineSpec
from minivtc.fairness.scheduler import Scheduler
from minivtc.model.llama import Llama
from minivtc.model.tokenizer import Tokenizer


def build_engine(
    model: Llama,
    tokenizer: Tokenizer | None,
    scheduler: str | Scheduler | EngineSpec = "fcfs",
    *,
    compile_attention: bool | None = None,
    max_model_len: int | None = None,
    clock: Callable[[], float] = time.monotonic,
    **spec: Any,
) -> Engine:
    """An engine over `model`, as `scheduler` says: an `EngineSpec`, or a policy (a name or
    an object) with the spec's other fields and the engine's options as keywords (kv_tokens,
    kv_bytes, block_size, prefix_caching, weights, reservation, victim, max_running, ...).
    With `kv_bytes` the pool fills that many bytes of the model's dtype.

    `compile_attention=None` means on for CUDA, off for CPU (compiling costs more than it saves
    on a laptop CPU). `max_model_len` caps prompt + max_tokens below the model's context
    (vLLM's name)."""
    engine_spec = EngineSpec.of(scheduler, **spec)
    weight = model.embed_tokens.weight
    pool_options = {
        "dtype": weight.dtype,
        "device": weight.device,
        "allocator": engine_spec.allocator,
    }
    block_size = engine_spec.block_size
    if engine_spec.kv_bytes is not None:
        pool = KVPool.from_bytes(model.config, engine_spec.kv_bytes, block_size, **pool_options)
    else:
        pool = KVPool.from_tokens(model.config, engine_spec.pool_tokens, block_size, **pool_options)
    if compile_attention is None:
        compile_attention = weight.device.type == "cuda"
    return Engine(
        runner=ModelRunner(model, pool, compile_attention),
        allocator=pool.allocator,
        scheduler=engine_spec.scheduler(),
        max_positions=context_positions(model.config.max_positions, max_model_len),
        eos_id=model.config.eos_id,
        tokenizer=tokenizer,
        clock=clock,
        options=engine_spec.options,
    )


def context_positions(model_positions: int, max_model_len: int | None) -> int:
    if max_model_len is None:
        return model_positions
    if max_model_len > model_positions:
        raise ValueError(
            f"max_model_len={max_model_len} is more than the model's context ({model_positions})"
        )
    return max_model_len
