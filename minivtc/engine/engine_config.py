"""The engine's configuration: one frozen, validated value saying which engine to build.

Owns `EngineConfig`, flat, as nano-vllm's `Config`: the policy (a name from
`fairness.policies`, or an object), the KV pool (in tokens or in bytes, its block size, whether
it caches prefixes), what VTC charges for a cached prompt token (w_c), the operator's client
weights, the seed of a randomised policy, how the engine admits, preempts and checks (Lessons 3
and 10), and what only a model has (compiled attention, the context a request may use). Every
front door builds it: `build_engine(...)` (the server, the coursework, the benchmarks),
`LLM(...)`, `simulate(...)`, `simulate_fleet(...)` and the command line, keywords through
`EngineConfig.of` alone, so a refusal ("kv_tokens or kv_bytes, not both", "victim without
reservation 'none'") is written once, here. The names are vLLM's where vLLM has one for the
same thing (`block_size`, `max_model_len`); `LLM(...)` also reads vLLM's `max_num_seqs` and
`enable_prefix_caching` (`offline/args.py`) as `max_running` and `prefix_caching`, the words
the engine and the command line use.

Not here: the server's front-end options (`serving.server.AppOptions`: who may call it, how
much, how a chat is rendered), which vLLM too keeps apart from its engine's; and anything that
needs I/O or another object. What depends on the model or the device (bytes into blocks, a
context longer than the model's, compiled attention by default on CUDA) is decided where the
engine is built (`factory.py`, the simulator); what depends on the pool or the policy where
they meet (the default gap, w_q M / 4, is the policy's, `VTCLedger.set_preempt_gap`; a gap too
small for the pool's blocks, `preemption.refuse_thrashing`; a bound the policy does not state,
`fairness_check.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from minivtc.engine.kv_pool import BlockAllocator
from minivtc.engine.prefix_cache import PrefixCachingAllocator
from minivtc.fairness.policies import make_scheduler
from minivtc.fairness.scheduler import Scheduler

__all__ = ["CONFIG_FIELDS", "ENGINE_OPTIONS", "EngineConfig"]

DEFAULT_KV_TOKENS = 10000  # the pool of the paper's A10G experiments (Section 5)
RESERVATIONS = ("full", "peak", "none")
VICTIMS = ("latest", "fair")
PREEMPTIONS = ("recompute", "swap")
# how the engine admits, preempts and checks (the engine's own loop reads these)
ENGINE_OPTIONS = (
    "reservation",
    "victim",
    "preempt_gap",
    "preemption",
    "swap_tokens",
    "admit_every",
    "max_running",
    "check_invariants",
    "check_fairness",
)


@dataclass(frozen=True)
class EngineConfig:
    """Which engine. None means "not given": an option given where it means nothing is
    refused, not ignored.

    The policy and its books: `policy` (a name, `policies.make_scheduler`, or an object),
    `cached_weight` (w_c, `cost.cache_discount`), `weights` (the operator's shares for the VTC
    family, never taken from requests), `seed` (a randomised policy's).

    The pool: `kv_tokens`, or `kv_bytes` of the device's memory (default `DEFAULT_KV_TOKENS`),
    cut into `block_size` blocks; `prefix_caching` (`prefix_cache.py`).

    Admission and preemption (`admission.py`, `preemption.py`):
    - `reservation`: "full" reserves prompt + max_tokens at admission (Lemma 4.3's proof
      condition), "peak" admits if the batch's peak fits (the artifact's check), "none"
      allocates blocks on demand and preempts a `victim` when they run out;
    - `victim` (reservation "none"; default "latest", vLLM's): "fair" preempts the client
      with the highest counter, and also displaces one leading a waiting client by more than
      `preempt_gap` (default w_q M / 4; `preemption.Fair`);
    - `preemption` (reservation "none"; default "recompute"): what a victim keeps, nothing
      or, "swap", its keys and values in `swap_tokens` of host memory (default the pool);
    - `admit_every`: admission rounds every this many steps after a successful one (the
      artifact's 10); `max_running`: the most requests in the batch;
    - `check_invariants` (every invariant after every step, for tests) and `check_fairness`
      (the policy's stated bound after every step: `fairness_check.py`).

    The model's: `compile_attention` (None: on for CUDA, off for CPU, where compiling costs
    more than it saves) and `max_model_len` (caps prompt + max_tokens below the model's
    context; None: the model's).
    """

    policy: str | Scheduler = "fcfs"
    kv_tokens: int | None = None
    kv_bytes: int | None = None
    block_size: int = 16
    prefix_caching: bool = False
    cached_weight: float | None = None
    weights: Mapping[str, float] | None = None
    seed: int = 0
    reservation: str = "full"
    victim: str | None = None
    preempt_gap: float | None = None
    preemption: str | None = None
    swap_tokens: int | None = None
    admit_every: int = 1
    max_running: int = 256
    check_invariants: bool = False
    check_fairness: bool = False
    compile_attention: bool | None = None
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        self.check_pool()
        self.check_preemption()
        if self.check_fairness and self.fair_victim and self.admit_every > 1:
            raise ValueError(
                "check_fairness: the preemptive bound needs a displacement round every step; "
                "with admit_every > 1 a client can run ahead of a blocked one unchecked"
            )
        if self.admit_every < 1 or self.max_running < 1:
            raise ValueError(
                f"admit_every and max_running must be >= 1, got {self.admit_every}, "
                f"{self.max_running}"
            )
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")

    @classmethod
    def of(
        cls, policy: str | Scheduler | EngineConfig | None = None, /, **keywords: Any
    ) -> EngineConfig:
        """The config a front door's keywords describe (this class's fields, the policy first
        or among them); a config passes through as it is (with no keywords)."""
        if isinstance(policy, EngineConfig):
            if keywords:
                raise TypeError(f"give a config or its keywords, not both: {sorted(keywords)}")
            return policy
        return cls(**keywords) if policy is None else cls(policy, **keywords)

    @property
    def pool_tokens(self) -> int:
        """The pool's size in tokens (with `kv_bytes`, the builder converts bytes instead)."""
        return DEFAULT_KV_TOKENS if self.kv_tokens is None else self.kv_tokens

    @property
    def allocator(self) -> type[BlockAllocator]:
        """The pool's allocator: blocks, or blocks that share cached prefixes."""
        return PrefixCachingAllocator if self.prefix_caching else BlockAllocator

    @property
    def fair_victim(self) -> bool:
        return self.victim == "fair"

    @property
    def swaps(self) -> bool:
        return self.preemption == "swap"

    def scheduler(self) -> Scheduler:
        """The policy, made from its name (an object is used as it is)."""
        if not isinstance(self.policy, str):
            return self.policy
        weights = None if self.weights is None else dict(self.weights)
        return make_scheduler(
            self.policy, weights=weights, seed=self.seed, cached_weight=self.cached_weight
        )

    def options(self) -> dict[str, Any]:
        """How the engine admits, preempts and checks (`ENGINE_OPTIONS`), by name."""
        return {name: getattr(self, name) for name in ENGINE_OPTIONS}

    def check_pool(self) -> None:
        if self.kv_tokens is not None and self.kv_bytes is not None:
            raise ValueError("give kv_tokens or kv_bytes, not both")
        if self.kv_tokens is not None and self.kv_tokens < 1:
            raise ValueError(
                f"a KV pool of {self.kv_tokens} tokens holds nothing: give at least one "
                f"block ({self.block_size} tokens)"
            )
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")

    def check_preemption(self) -> None:
        refuse_unknown("reservation", self.reservation, RESERVATIONS)
        given = [n for n in ("victim", "preempt_gap", "preemption") if getattr(self, n) is not None]
        if self.reservation != "none" and given:
            raise ValueError(
                f"{', '.join(given)} only {'means' if len(given) == 1 else 'mean'} something "
                f"with reservation 'none' (blocks on demand), not {self.reservation!r}"
            )
        if self.victim is not None:
            refuse_unknown("victim", self.victim, VICTIMS)
        if self.preemption is not None:
            refuse_unknown("preemption", self.preemption, PREEMPTIONS)
        if self.preempt_gap is not None:
            if self.victim != "fair":
                raise ValueError("preempt_gap only means something with victim 'fair'")
            if not self.preempt_gap >= 0:  # (nan fails too)
                raise ValueError(
                    f"preempt_gap must be >= 0 (inf: never displace), got {self.preempt_gap}"
                )
        if self.swap_tokens is not None:
            if self.preemption != "swap":
                raise ValueError("swap_tokens only means something with preemption 'swap'")
            if not self.swap_tokens >= 0:
                raise ValueError(f"swap_tokens must be >= 0, got {self.swap_tokens}")


CONFIG_FIELDS = frozenset(f.name for f in fields(EngineConfig))


def refuse_unknown(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        names = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {names}, got {value!r}")
