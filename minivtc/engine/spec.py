"""The engine's spec: one frozen, validated value saying which engine to build.

Owns `EngineSpec`: the policy (a name from `fairness.policies`, or an object), the KV pool (in
tokens or in bytes, its block size, whether it caches prefixes), what VTC charges for a cached
prompt token (w_c), the operator's client weights, the seed of a randomised policy, and the
engine's options (`options.EngineOptions`: admission, preemption, checks). Every front door
builds it: `build_engine(...)` (the server, the coursework, the benchmarks), `LLM(...)`,
`simulate(...)`, `simulate_fleet(...)` and the command line, each through `EngineSpec.of`, so
a refusal ("kv_tokens or kv_bytes, not both", "options or its keywords, not both") is written
once, here. No I/O: what depends on the model or the device (bytes into blocks, compiled
attention) is decided where the engine is built (`factory.py`, the simulator).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from minivtc.engine.kv_pool import BlockAllocator
from minivtc.engine.options import EngineOptions
from minivtc.engine.prefix_cache import PrefixCachingAllocator
from minivtc.fairness.policies import make_scheduler
from minivtc.fairness.scheduler import Scheduler

DEFAULT_KV_TOKENS = 10000  # the pool of the paper's A10G experiments (Section 5)


@dataclass(frozen=True)
class EngineSpec:
    """Which engine: `policy` (a name, `policies.make_scheduler`, or an object), the pool
    (`kv_tokens`, or `kv_bytes` of the device's memory; default `DEFAULT_KV_TOKENS`) cut into
    `block_size` blocks, `prefix_caching` (`prefix_cache.py`), `cached_weight` (w_c,
    `cost.cache_discount`), `weights` (the operator's shares for the VTC family, never taken
    from requests), `seed` (a randomised policy's), and `options` (`EngineOptions`)."""

    policy: str | Scheduler = "fcfs"
    kv_tokens: int | None = None
    kv_bytes: int | None = None
    block_size: int = 16
    prefix_caching: bool = False
    cached_weight: float | None = None
    weights: Mapping[str, float] | None = None
    seed: int = 0
    options: EngineOptions = field(default_factory=EngineOptions)

    def __post_init__(self) -> None:
        if self.kv_tokens is not None and self.kv_bytes is not None:
            raise ValueError("give kv_tokens or kv_bytes, not both")
        if self.kv_tokens is not None and self.kv_tokens < 1:
            raise ValueError(
                f"a KV pool of {self.kv_tokens} tokens holds nothing: give at least one "
                f"block ({self.block_size} tokens)"
            )
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if not isinstance(self.options, EngineOptions):
            raise TypeError(f"options must be EngineOptions, got {type(self.options).__name__}")

    @classmethod
    def of(cls, policy: str | Scheduler | EngineSpec = "fcfs", **keywords: Any) -> EngineSpec:
        """The spec a front door's keywords describe: this class's fields, and `options` or
        the keywords that build it (`EngineOptions`' fields: reservation, victim, ...). A
        spec passes through as it is (with no keywords)."""
        if isinstance(policy, EngineSpec):
            if keywords:
                raise TypeError(f"give a spec or its keywords, not both: {sorted(keywords)}")
            return policy
        own = {k: keywords.pop(k) for k in SPEC_FIELDS & set(keywords)}
        options = own.pop("options", None)
        if options is not None and keywords:
            raise TypeError(f"give options or its keywords, not both: {sorted(keywords)}")
        return cls(policy, options=options or EngineOptions(**keywords), **own)

    @property
    def pool_tokens(self) -> int:
        """The pool's size in tokens (with `kv_bytes`, the builder converts bytes instead)."""
        return DEFAULT_KV_TOKENS if self.kv_tokens is None else self.kv_tokens

    @property
    def allocator(self) -> type[BlockAllocator]:
        """The pool's allocator: blocks, or blocks that share cached prefixes."""
        return PrefixCachingAllocator if self.prefix_caching else BlockAllocator

    def scheduler(self) -> Scheduler:
        """The policy, made from its name (an object is used as it is)."""
        if not isinstance(self.policy, str):
            return self.policy
        weights = None if self.weights is None else dict(self.weights)
        return make_scheduler(
            self.policy, weights=weights, seed=self.seed, cached_weight=self.cached_weight
        )


SPEC_FIELDS = {f.name for f in fields(EngineSpec)} - {"policy"}
