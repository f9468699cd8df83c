"""vLLM's metric names, beside minivtc's on `/metrics`, so a vLLM dashboard shows this server.

Owns `vllm_families`: the series below, each labelled `model_name` (the served name) and
meaning what vLLM's does, made from the same `Snapshot` (`snapshot.py`) as minivtc's own
(`observability.py`):

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
(`minivtc_client_counter`, `minivtc_client_service`, per client tokens and queues:
`observability.py`). vLLM's per-token timing histograms (inter-token latency, queue and
prefill time) are not reported. Lesson 9.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from minivtc.serving.openai_api import FINISH_REASONS

__all__ = ["vllm_families"]

if TYPE_CHECKING:  # (observability.py reports these beside its own)
    from minivtc.serving.snapshot import Snapshot


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
