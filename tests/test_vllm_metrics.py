"""vLLM's metric names on /metrics, beside minivtc's and agreeing with them."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from minivtc.serving.observability import prometheus_text
from minivtc.serving.server_stats import ClientRow, Snapshot


def samples(text: bytes) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_vllm_series_mean_what_minivtcs_do():
    snap = Snapshot(
        scheduler="vtc",
        clients={"a": ClientRow(3.0, 1.0, 2, 1, 40, 10), "b": ClientRow(1.0, 1.0, 1, 2, 5, 7)},
        used_blocks=3,
        total_blocks=12,
        block_size=16,
        finished={("a", "eos"): 2, ("b", "stop"): 1, ("b", "length"): 4, ("a", "abort"): 1},
        ttft=[("0.1", 2), ("+Inf", 3)],
        ttft_sum=0.5,
        latency=[("1.0", 1), ("+Inf", 3)],
        latency_sum=4.0,
        forgotten=ClientRow(None, 1.0, 0, 0, 100, 50),
        preemptions=6,
        prompt_tokens=145,
        cached_tokens=32,
    )
    got = samples(prometheus_text(snap, model_name="llama-tiny"))
    m = (("model_name", "llama-tiny"),)
    assert got[("vllm:num_requests_running", m)] == 3
    assert got[("vllm:num_requests_waiting", m)] == 3
    assert got[("vllm:kv_cache_usage_perc", m)] == got[("vllm:gpu_cache_usage_perc", m)] == 0.25
    assert got[("vllm:prompt_tokens_total", m)] == 145  # forgotten clients' tokens too
    assert got[("vllm:generation_tokens_total", m)] == 67
    reason = lambda r: (("finished_reason", r), *m)  # noqa: E731
    assert got[("vllm:request_success_total", reason("stop"))] == 3  # EOS and stop strings
    assert got[("vllm:request_success_total", reason("length"))] == 4
    assert got[("vllm:request_success_total", reason("abort"))] == 1
    assert got[("vllm:num_preemptions_total", m)] == 6
    assert got[("vllm:prefix_cache_queries_total", m)] == 145
    assert got[("vllm:prefix_cache_hits_total", m)] == 32
    assert got[("vllm:time_to_first_token_seconds_count", m)] == 3
    assert got[("vllm:time_to_first_token_seconds_sum", m)] == 0.5
    assert got[("vllm:e2e_request_latency_seconds_bucket", (("le", "1.0"), *m))] == 1
    # minivtc's own, beside them
    assert got[("minivtc_kv_blocks_used", ())] == 3
    assert got[("minivtc_client_counter", (("client", "a"),))] == 3.0
