"""What the server reports: the fairness view (`/fairness`) and Prometheus metrics (`/metrics`).

Owns: the two views, built from a `Snapshot` (`server_stats.py`: a copy of what the reports need,
taken on the engine thread between two steps) away from the engine thread. Does not own: routes
(`server.py`) or the numbers' meaning (the scheduler's counters, the engine's token counts).
Lesson 9 reads both views.

The Prometheus text is made by `prometheus_client`, which owns the format and its escaping.
Per-client series are capped: every tenant (an API key's client: a fixed set, never forgotten)
and the `top` other clients by service get their own label, the rest (and clients the server
has forgotten, see `EngineLoop.forget_idle_clients`) are summed under `client="(other)"`, so a
scrape stays small however many client ids the server has seen.

vLLM's metric names are reported beside minivtc's (`vllm_families`), so a vLLM dashboard shows
this server: the series below, each labelled `model_name` (the served name) and meaning what
vLLM's does, made from the same `Snapshot`:

| series | kind | meaning |
| --- | --- | --- |
| `vllm:num_requests_running` | gauge | requests in the running batch |
| `vllm:num_requests_waiting` | gauge | requests queued, preempted ones included |
| `vllm:kv_cache_usage_perc` | gauge | share of KV blocks in use, 0 to 1 (and its old name) |
| `vllm:prompt_tokens_total` | counter | prompt tokens admitted (prefilled or found cached) |
| `vllm:generation_tokens_total` | counter | tokens generated |
| `vllm:request_success_total` | counter | requests finished, by `finished_reason` |
| `vllm:num_preemptions_total` | counter | preemptions (reservation "none") |
| `vllm:prefix_cache_queries_total` | counter | prompt tokens looked up in the prefix cache |
| `vllm:prefix_cache_hits_total` | counter | of those, tokens found there |
| `vllm:time_to_first_token_seconds` | histogram | arrival to first token, per request |
| `vllm:e2e_request_latency_seconds` | histogram | arrival to finish, per request |

The old name of the KV gauge is `vllm:gpu_cache_usage_perc`; a `finished_reason` is stop,
length, abort, or "error" (a request that failed alone). Only minivtc has the fairness series
(`minivtc_client_counter`, `minivtc_client_service`, per client tokens and queues). vLLM's
per-token timing histograms (inter-token latency, queue and prefill time) are not reported.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from minivtc.fairness.cost import W_P, W_Q
from minivtc.serving.openai_api import FINISH_REASONS
from minivtc.serving.server_stats import OTHER, TOP_CLIENTS, ClientRow, Snapshot

__all__ = ["fairness_view", "prometheus_text", "vllm_families"]

Counter, Gauge = CounterMetricFamily, GaugeMetricFamily  # (the tables' kinds, short)


def fairness_view(snap: Snapshot, only: str | None = None) -> dict:
    """`/fairness`: per client, counter, weight, waiting, running, tokens, service so far and
    KV blocks held now, and the pool's use. `only`: a tenant's view, that client's row alone
    and no pool-wide use (the pool's `used_blocks` told one tenant another's prompt sizes).

    What a tenant's view still shares with the others: the pool's size and block size and the
    scheduler's name (the server's configuration), and through its own counter, their load: VTC
    lifts a client that comes back from idle to the smallest counter among those waiting
    (Algorithm 2), so a counter that jumps on return says how much the others were served."""
    clients = {
        c: row.as_dict() for c, row in sorted(snap.clients.items()) if only is None or c == only
    }
    kv = {"total_blocks": snap.total_blocks, "block_size": snap.block_size}
    if only is None:
        kv = {"used_blocks": snap.used_blocks, **kv}
    return {"scheduler": snap.scheduler, "kv": kv, "clients": clients}


def prometheus_text(snap: Snapshot, top: int = TOP_CLIENTS, model_name: str = "") -> bytes:
    """minivtc's series, then vLLM's names for what both report (`vllm_families`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families([*families(snap, top), *vllm_families(snap, model_name)]))
    return generate_latest(registry)


class Families:
    """A prometheus_client collector that yields metric families made beforehand."""

    def __init__(self, made: list[Metric]) -> None:
        self.made = made

    def collect(self) -> Iterable[Metric]:
        return self.made


class Series(NamedTuple):
    """One metric family: its name, kind, the field its value is read from (of a client's
    row, for a per-client family; of the snapshot, for a server-wide one) and its help text."""

    name: str
    kind: type[CounterMetricFamily] | type[GaugeMetricFamily]
    field: str
    help: str


# One sample per labelled client (`labelled_rows`); a None value is left out (a sum of counters
# means nothing, so "(other)" has no counter; nor has a client the scheduler has forgotten).
PER_CLIENT = (
    Series("minivtc_client_input_tokens", Counter, "input_tokens", "Prompt tokens processed."),
    Series("minivtc_client_output_tokens", Counter, "output_tokens", "Tokens generated."),
    Series(
        "minivtc_client_service",
        Counter,
        "service",
        f"Service delivered: w_p*input + w_q*output (w_p={W_P:g}, w_q={W_Q:g}).",
    ),
    Series("minivtc_client_counter", Gauge, "counter", "VTC's virtual token counter."),
    Series("minivtc_requests_waiting", Gauge, "waiting", "Requests waiting to be admitted."),
    Series("minivtc_requests_running", Gauge, "running", "Requests in the running batch."),
)

# One sample each, for the whole server.
SERVER_WIDE = (
    Series("minivtc_kv_blocks_used", Gauge, "used_blocks", "KV blocks held by requests."),
    Series("minivtc_kv_blocks_total", Gauge, "total_blocks", "KV blocks in the pool."),
    Series("minivtc_preemptions", Counter, "preemptions", "Requests preempted to free KV blocks."),
    Series(
        "minivtc_recomputed_tokens",
        Counter,
        "recomputed_tokens",
        "Tokens whose keys and values were computed again after a preemption threw them away.",
    ),
    Series(
        "minivtc_swapped_tokens",
        Counter,
        "swapped_tokens",
        "Tokens whose keys and values a preemption swapped to host memory (counted out and in).",
    ),
    Series(
        "minivtc_swap_tokens_used",
        Gauge,
        "host_tokens",
        "Tokens of keys and values swapped out to host memory now.",
    ),
    Series(
        "minivtc_swap_tokens_total",
        Gauge,
        "swap_tokens",
        "Tokens of keys and values host memory may hold (0: no swapping; "
        "a preemption that would need more recomputes).",
    ),
    Series(
        "minivtc_prompt_tokens", Counter, "prompt_tokens", "Prompt tokens of the requests admitted."
    ),
    Series(
        "minivtc_prefix_cache_hit_tokens",
        Counter,
        "cached_tokens",
        "Prompt tokens found in the prefix cache (prefill skipped).",
    ),
    Series(
        "minivtc_prefix_cache_hit_rate",
        Gauge,
        "prefix_cache_hit_rate",
        "Share of admitted prompt tokens found in the prefix cache.",
    ),
)


def families(snap: Snapshot, top: int) -> Iterable[Metric]:
    """The tables' families in order: per client, finish counts, the two histograms, and the
    server-wide ones."""
    rows = labelled_rows(snap, top)
    for series in PER_CLIENT:
        family = series.kind(series.name, series.help, labels=["client"])
        for client, row in rows.items():
            if (value := getattr(row, series.field)) is not None:
                family.add_metric([client], value)
        yield family
    yield finished(snap, rows)
    histograms = (
        ("minivtc_time_to_first_token_seconds", snap.ttft, snap.ttft_sum, "Arrival to 1st token."),
        ("minivtc_request_latency_seconds", snap.latency, snap.latency_sum, "Arrival to last."),
    )
    for name, buckets, total, what in histograms:
        yield HistogramMetricFamily(name, what, buckets=buckets, sum_value=total)
    for series in SERVER_WIDE:
        yield series.kind(series.name, series.help, value=getattr(snap, series.field))


def finished(snap: Snapshot, rows: dict[str, ClientRow]) -> Metric:
    """Requests finished, by client (a client without its own label counts as OTHER) and reason."""
    family = CounterMetricFamily(
        "minivtc_requests_finished", "Requests finished, by reason.", labels=["client", "reason"]
    )
    by_label: dict[tuple[str, str], int] = {}
    for (client, reason), n in snap.finished.items():
        key = (client if client in rows else OTHER, reason)
        by_label[key] = by_label.get(key, 0) + n
    for (client, reason), n in sorted(by_label.items()):
        family.add_metric([client, reason], n)
    return family


def labelled_rows(snap: Snapshot, top: int) -> dict[str, ClientRow]:
    """Every tenant (an API key's client) and the `top` other clients by service under their
    own names; everyone else summed as OTHER (a client that calls itself OTHER too: its own
    label would be taken by the sum)."""
    tenants = {c: snap.clients[c] for c in snap.tenants if c in snap.clients and c != OTHER}
    named = [kv for kv in snap.clients.items() if kv[0] != OTHER and kv[0] not in tenants]
    ranked = sorted(named, key=lambda kv: (-kv[1].service, kv[0]))
    rows = tenants | dict(ranked[:top])
    rest = [row for _, row in ranked[top:]] + [snap.forgotten]
    if OTHER in snap.clients:
        rest.append(snap.clients[OTHER])
    other = ClientRow(counter=None)
    for row in rest:
        other.waiting += row.waiting
        other.running += row.running
        other.input_tokens += row.input_tokens
        other.output_tokens += row.output_tokens
    if len(rest) > 1 or other.input_tokens or other.output_tokens:
        rows[OTHER] = other
    return rows


# --- vLLM's names ---------------------------------------------------------------------------


def vllm_families(snap: Snapshot, model_name: str) -> Iterable[Metric]:
    label = ["model_name"]

    def one(kind, name: str, what: str, value: float) -> Metric:
        family = kind(name, what, labels=label)
        family.add_metric([model_name], value)
        return family

    rows = [*snap.clients.values(), snap.forgotten]
    running, waiting = sum(r.running for r in rows), sum(r.waiting for r in rows)
    yield one(GaugeMetricFamily, "vllm:num_requests_running", "Requests running.", running)
    yield one(GaugeMetricFamily, "vllm:num_requests_waiting", "Requests waiting.", waiting)
    usage = snap.used_blocks / snap.total_blocks if snap.total_blocks else 0.0
    for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
        yield one(GaugeMetricFamily, name, "KV-cache usage: 1 means 100 percent.", usage)
    prompt, output = sum(r.input_tokens for r in rows), sum(r.output_tokens for r in rows)
    yield one(CounterMetricFamily, "vllm:prompt_tokens", "Prefill tokens processed.", prompt)
    yield one(CounterMetricFamily, "vllm:generation_tokens", "Generation tokens.", output)
    yield success(snap, model_name)
    yield one(CounterMetricFamily, "vllm:num_preemptions", "Preemptions.", snap.preemptions)
    queries, hits = snap.prompt_tokens, snap.cached_tokens
    yield one(CounterMetricFamily, "vllm:prefix_cache_queries", "Tokens queried.", queries)
    yield one(CounterMetricFamily, "vllm:prefix_cache_hits", "Tokens found cached.", hits)
    histograms = (
        ("vllm:time_to_first_token_seconds", snap.ttft, snap.ttft_sum, "Time to first token."),
        ("vllm:e2e_request_latency_seconds", snap.latency, snap.latency_sum, "End to end."),
    )
    for name, buckets, total, what in histograms:
        family = HistogramMetricFamily(name, what, labels=label)
        family.add_metric([model_name], buckets=buckets, sum_value=total)
        yield family


def success(snap: Snapshot, model_name: str) -> Metric:
    by_reason: dict[str, int] = {}
    for (_, reason), n in snap.finished.items():
        word = FINISH_REASONS.get(reason, reason)
        by_reason[word] = by_reason.get(word, 0) + n
    family = CounterMetricFamily(
        "vllm:request_success",
        "Finished requests, by reason.",
        labels=["model_name", "finished_reason"],
    )
    for reason, n in sorted(by_reason.items()):
        family.add_metric([model_name, reason], n)
    return family
