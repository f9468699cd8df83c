"""What the server reports about its requests, kept on the engine thread (`ServerStats`) and
copied from it between two steps (`Snapshot`).

Owns: first-token and end-to-end latency histograms, each client's times to first token (the
dashboard's mean and recent), finish counts per client and reason, the token totals of clients
the engine has forgotten, and `ServerStats.snapshot`, which copies these and the engine's own
numbers into a `Snapshot` between two steps (plain dict copies: the engine waits only for
those). `/fairness` and `/metrics` (`observability.py`, vLLM's metric names included) and the
dashboard (`dashboard.py`) are all built from a snapshot, afterwards, away from the engine
thread. Does not own the thread or its commands (`engine_loop.py`, which calls `record`,
`forget` and `snapshot` on its thread, and nobody else does), nor the reports made from a
snapshot. Lesson 9 reads them.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import asdict, dataclass, field

from minivtc.engine.engine import Engine, blocks_by_client, engine_stats
from minivtc.fairness.cost import W_P, W_Q
from minivtc.requests.request import ClientTokens, Request

__all__ = ["ClientRow", "FirstTokens", "Histogram", "LATENCY_BUCKETS", "OTHER", "ServerStats"]
__all__ += ["Snapshot", "TOP_CLIENTS"]

OTHER = "(other)"  # the label of every client outside the top N, and of forgotten ones
TOP_CLIENTS = 50
RECENT_FIRST_TOKENS = 10  # a client's "recent" time to first token: the mean of its last 10
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)  # seconds


@dataclass
class Histogram:
    """A Prometheus histogram: counts per upper bound (`le`), plus the sum and count."""

    bounds: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(init=False)  # one per bound, and one for +Inf
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le is inclusive
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, count of observations <= le) for every bound and +Inf, as Prometheus writes it."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return out


class ServerStats:
    """The server's statistics, one thread's (the engine loop's). `tenants` (client -> weight:
    the API keys' clients, a fixed set, so forgetting them saves nothing) keep their rows and
    totals for the life of the server; other clients' totals, once the engine forgets them, are
    summed in `forgotten` (so no monotone metric shrinks)."""

    def __init__(self, tenants: dict[str, float] | None = None) -> None:
        self.tenants = dict(tenants or {})
        self.forgotten = ClientRow()  # token totals of forgotten clients
        # A tenant's totals from before the engine last forgot it: the engine counts afresh
        # when it comes back, and the sum only ever grows.
        self.kept = {c: ClientRow(None, weight) for c, weight in self.tenants.items()}
        self.ttft = Histogram()
        self.first_tokens: dict[str, FirstTokens] = {}  # the same, per client (the dashboard)
        self.latency = Histogram()
        self.finished: dict[tuple[str, str], int] = {}  # (client, finish reason) -> count

    def record(self, request: Request) -> None:
        """A request ended (finished or aborted): its times and its finish reason."""
        if request.first_token_time is not None:
            ttft = request.first_token_time - request.arrival_time
            self.ttft.observe(ttft)
            self.first_tokens.setdefault(request.client_id, FirstTokens()).observe(ttft)
        if request.finish_time is not None:
            self.latency.observe(request.finish_time - request.arrival_time)
        key = (request.client_id, request.finish_reason or "")
        self.finished[key] = self.finished.get(key, 0) + 1

    def forget(self, gone: dict[str, ClientTokens]) -> None:
        """The engine forgot these idle clients (`engine.forget_idle_clients`): keep their
        totals, a tenant's under its own name, anyone else's under `forgotten` and OTHER."""
        for client, tokens in gone.items():
            row = self.kept.get(client, self.forgotten)
            row.input_tokens += tokens.num_input
            row.output_tokens += tokens.num_output
        for client in [c for c in gone if c not in self.tenants]:
            self.first_tokens.pop(client, None)
        for key in [k for k in self.finished if k[0] in gone and k[0] not in self.tenants]:
            other = (OTHER, key[1])
            self.finished[other] = self.finished.get(other, 0) + self.finished.pop(key)

    def snapshot(self, engine: Engine) -> Snapshot:
        """What the reports need, copied between two steps (on the engine's thread)."""
        a = engine.allocator
        return Snapshot(
            scheduler=engine.scheduler.name,
            clients=self.rows(engine),
            used_blocks=a.num_used_blocks,
            total_blocks=a.num_blocks,
            block_size=a.block_size,
            finished=dict(self.finished),
            ttft=self.ttft.cumulative(),
            ttft_sum=self.ttft.total,
            latency=self.latency.cumulative(),
            latency_sum=self.latency.total,
            forgotten=ClientRow(
                None, 1.0, 0, 0, self.forgotten.input_tokens, self.forgotten.output_tokens
            ),
            **asdict(engine_stats(engine)),  # preemptions; prompt, cached, recomputed, swapped
            tenants=tuple(self.tenants),
            first_tokens={c: f.copy() for c, f in self.first_tokens.items()},
            taken=time.monotonic(),
        )

    def rows(self, engine: Engine) -> dict[str, ClientRow]:
        """Per client: the scheduler's counter and weight, tokens (a tenant's kept totals
        added), requests waiting and running, and the KV blocks its requests hold."""
        rows: dict[str, ClientRow] = {}
        for client, (counter, weight) in engine.scheduler.ledger.accounts().items():
            rows[client] = ClientRow(counter, weight)
        for client, tokens in engine.client_tokens.items():
            row = rows.setdefault(client, ClientRow())
            row.input_tokens, row.output_tokens = tokens.num_input, tokens.num_output
        for client, kept in self.kept.items():  # (counter None: the scheduler forgot it, idle)
            row = rows.setdefault(client, ClientRow(None, kept.weight))
            row.input_tokens += kept.input_tokens
            row.output_tokens += kept.output_tokens
        for r in engine.scheduler.waiting():
            rows.setdefault(r.client_id, ClientRow()).waiting += 1
        for r in engine.running:
            rows.setdefault(r.client_id, ClientRow()).running += 1
        for client, blocks in blocks_by_client(engine).items():
            rows.setdefault(client, ClientRow()).blocks = blocks
        return rows


# --- the snapshot: what the reports read --------------------------------------------------


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
