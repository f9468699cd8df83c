"""`Snapshot`: a copy of what the server's reports need, taken on the engine thread between two
steps (plain dict copies: the engine waits only for those).

`/fairness` and `/metrics` (`observability.py`, vLLM's metric names included) and the
dashboard (`dashboard.py`) are all built from one, afterwards, away from the engine thread.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from minivtc.fairness.cost import W_P, W_Q

__all__ = ["ClientRow", "FirstTokens", "OTHER", "Snapshot", "TOP_CLIENTS"]

OTHER = "(other)"  # the label of every client outside the top N, and of forgotten ones
TOP_CLIENTS = 50
RECENT_FIRST_TOKENS = 10  # a client's "recent" time to first token: the mean of its last 10


@dataclass
class ClientRow:
    counter: float | None = None  # VTC's counter (None under a policy without one)
    weight: float = 1.0
    waiting: int = 0
    running: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    blocks: int = 0  # KV blocks its requests hold now (blocks one prefix shares count once)

    @property
    def service(self) -> float:
        """What the client received, w_p per prompt token (cached or not: a cached_weight
        changes what the counter charges for it, not what the client got) and w_q per output
        token, with the paper's cost."""
        return W_P * self.input_tokens + W_Q * self.output_tokens

    def as_dict(self) -> dict:
        return {
            "counter": self.counter,
            "weight": self.weight,
            "waiting": self.waiting,
            "running": self.running,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "service": self.service,
            "blocks": self.blocks,
        }


@dataclass
class FirstTokens:
    """One client's times to first token (seconds, arrival to first token) of the requests it
    finished: how many, their sum, and the latest few (the dashboard's mean and recent)."""

    count: int = 0
    total: float = 0.0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_FIRST_TOKENS))

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        self.recent.append(seconds)

    def copy(self) -> FirstTokens:
        return FirstTokens(self.count, self.total, deque(self.recent, self.recent.maxlen))

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    @property
    def recent_mean(self) -> float | None:
        return sum(self.recent) / len(self.recent) if self.recent else None


@dataclass
class Snapshot:
    scheduler: str
    clients: dict[str, ClientRow]
    used_blocks: int
    total_blocks: int
    block_size: int
    finished: dict[tuple[str, str], int]  # (client, finish reason) -> requests
    ttft: list[tuple[str, int]] = field(default_factory=list)  # histogram: (le, cumulative)
    ttft_sum: float = 0.0
    latency: list[tuple[str, int]] = field(default_factory=list)
    latency_sum: float = 0.0
    forgotten: ClientRow = field(default_factory=ClientRow)  # summed over forgotten clients
    preemptions: int = 0  # requests preempted to make room (reservation "none")
    recomputed_tokens: int = 0  # keys and values computed again after a preemption
    swapped_tokens: int = 0  # keys and values a preemption moved to host memory (and back)
    prompt_tokens: int = 0  # of the requests admitted
    cached_tokens: int = 0  # of which the prefix cache held (their prefill was skipped)
    host_tokens: int = 0  # preemption="swap": keys and values on the host now
    swap_tokens: int = 0  # and how many it may hold (0: no swapping)
    tenants: tuple[str, ...] = ()  # the API keys' clients: each always has its own label
    first_tokens: dict[str, FirstTokens] = field(default_factory=dict)  # per client
    taken: float = 0.0  # when (time.monotonic()): the dashboard's rates divide by its steps

    @property
    def prefix_cache_hit_rate(self) -> float:
        """The share of admitted prompt tokens the prefix cache held (0 before any)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
