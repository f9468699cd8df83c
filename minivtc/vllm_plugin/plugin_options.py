"""The fair scheduler's options inside vLLM: `PluginOptions`, read from vLLM's
`additional_config` (`--additional-config '{"minivtc": {...}}'`, or `LLM(additional_config=)`).

vLLM builds its scheduler itself, with its own arguments only; `additional_config` is the
free-form part of its configuration that reaches the engine process, so it carries these:

    policy          a name `make_scheduler` knows: vtc (default), vtc-profile, vtc-predict,
                    vtc-oracle, lcf, fcfs, drr, drr:Q, ... (not rpm:N: vLLM's queue cannot
                    reject a request it has accepted)
    weights         a JSON file of client -> weight (Section 4.3), or none (every weight 1)
    default_client  the client of a request whose extra_args name none ("default")
    check_fairness  assert Lemma 4.3 on the waiting counters after every step (off)

Imports no vLLM. `fair_scheduler.py` reads it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minivtc.fairness.policies import make_scheduler
from minivtc.fairness.scheduler import Scheduler
from minivtc.vllm_plugin.policy_queue import DEFAULT_CLIENT

__all__ = ["PluginOptions"]

CONFIG_KEY = "minivtc"  # additional_config[CONFIG_KEY]: these options


@dataclass(frozen=True)
class PluginOptions:
    policy: str = "vtc"
    weights: str | None = None  # a JSON file: client -> weight
    default_client: str = DEFAULT_CLIENT
    check_fairness: bool = False

    def __post_init__(self) -> None:
        if self.policy.startswith("rpm"):
            raise ValueError(
                f"{self.policy}: a rate limit rejects requests, and vLLM's waiting queue cannot "
                "reject one vLLM has accepted; choose vtc, fcfs, drr or another of the VTC family"
            )
        if not self.default_client:
            raise ValueError("default_client must name a client")

    @classmethod
    def from_config(cls, additional_config: Any) -> PluginOptions:
        """From vLLM's `additional_config` (a dict; its "minivtc" entry, or the defaults)."""
        given = additional_config.get(CONFIG_KEY, {}) if isinstance(additional_config, dict) else {}
        if not isinstance(given, dict):
            raise ValueError(f'additional_config["{CONFIG_KEY}"] must be an object of options')
        unknown = set(given) - {"policy", "weights", "default_client", "check_fairness"}
        if unknown:
            raise ValueError(f'additional_config["{CONFIG_KEY}"]: unknown {sorted(unknown)}')
        return cls(**given)

    def make_policy(self) -> Scheduler:
        """The policy object, with the weights file's weights."""
        weights = read_weights(Path(self.weights)) if self.weights else None
        return make_scheduler(self.policy, weights=weights)


def read_weights(path: Path) -> dict[str, float]:
    """A JSON object of client -> weight > 0 (finite)."""
    try:
        weights = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read the weights ({e})") from None
    if not isinstance(weights, dict) or not all(
        isinstance(w, (int, float)) and 0 < w < math.inf for w in weights.values()
    ):
        raise ValueError(f"{path}: want an object of client -> weight > 0 (finite)")
    return {str(c): float(w) for c, w in weights.items()}
