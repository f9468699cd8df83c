"""`build_engine`: the one place an engine is put together from a model and a config.

Owns what joins a config (`engine_config.EngineConfig`: the policy, the pool, the options) to a
model: the pool's tensors on the model's device and dtype (its size in tokens, or in bytes),
whether attention is compiled, and the context a request may use. The server, the simulator's
calibration, the benchmarks, the coursework and the vLLM-style `LLM` (`offline/llm.py`) all
build their engine here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from minivtc.engine.engine import Engine
from minivtc.engine.engine_config import EngineConfig
from minivtc.engine.kv_pool import KVPool
from minivtc.engine.runner import ModelRunner
from minivtc.fairness.scheduler import Scheduler
from minivtc.model.llama import Llama
from minivtc.model.tokenizer import Tokenizer
from minivtc.requests.params import SamplingParams

__all__ = ["build_engine", "compile_shapes"]


def build_engine(
    model: Llama,
    tokenizer: Tokenizer | None,
    config: EngineConfig | str | Scheduler | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    **keywords: Any,
) -> Engine:
    """An engine over `model`, as `config` says: an `EngineConfig`, or a policy (a name or an
    object; default "fcfs") with the config's other fields as keywords (`EngineConfig.of`:
    kv_tokens, kv_bytes, block_size, prefix_caching, weights, reservation, victim, max_running,
    max_model_len, ...). With `kv_bytes` the pool fills that many bytes of the model's dtype."""
    config = EngineConfig.of(config, **keywords)
    weight = model.embed_tokens.weight
    pool_options = {"dtype": weight.dtype, "device": weight.device, "allocator": config.allocator}
    if config.kv_bytes is not None:
        pool = KVPool.from_bytes(model.config, config.kv_bytes, config.block_size, **pool_options)
    else:
        pool = KVPool.from_tokens(
            model.config, config.pool_tokens, config.block_size, **pool_options
        )
    compile_attention = config.compile_attention
    if compile_attention is None:  # (compiling costs more than it saves on a laptop CPU)
        compile_attention = weight.device.type == "cuda"
    return Engine(
        runner=ModelRunner(model, pool, compile_attention),
        allocator=pool.allocator,
        scheduler=config.scheduler(),
        max_positions=context_positions(model.config.max_positions, config.max_model_len),
        eos_id=model.config.eos_id,
        tokenizer=tokenizer,
        clock=clock,
        config=config,
    )


def compile_shapes(model: Llama) -> None:
    """Run a model compiled by `model/compiled.py` through the few shapes a server's steps give
    it (one request's prefill and decode; then two requests'), so that every later step finds
    its graph compiled and no client waits for a compile. A throwaway engine: the server's own
    (its counters, its pool, its cache) never sees these requests."""
    engine = build_engine(model, None, kv_tokens=64, max_running=2)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    for prompts in ([[1, 5, 6, 7]], [[1, 5, 6], [1, 8, 9, 10, 11]]):
        for prompt in prompts:
            engine.add_request(prompt, params)
        while engine.has_unfinished():
            engine.step()


def context_positions(model_positions: int, max_model_len: int | None) -> int:
    if max_model_len is None:
        return model_positions
    if max_model_len > model_positions:
        raise ValueError(
            f"max_model_len={max_model_len} is more than the model's context ({model_positions})"
        )
    return max_model_len
