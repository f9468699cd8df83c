"""The prefix-caching experiment (the paper's Appendix C.1 notes that cache-aware scheduling
conflicts with fair scheduling, and leaves it there): what a cached prompt token should cost.

Owns `prefix_caching(out)`, a section of `minivtc reproduce` (`--only prefix_caching`). Three
clients flood a 10,000-token pool (blocks of 16, A10G step times) with chat-sized requests; in
one workload client A sends a 1,500-token system prompt with every request, in the other A and
B share one. Each runs without a prefix cache, then with one under VTC charging a cached prompt
token w_c = w_p, w_p / 2 and 0. Reported: tokens/s, the hit rate, each client's service rate
(w_p per prompt token, cached or not, w_q per output token) and the worst backlogged gap, priced as
the counters price it, against Theorem 4.4's 2U, which caching leaves unchanged (a dispatch
still costs at most w_p L_input). Lemma 4.3 is asserted after every step of every run.
"""

from __future__ import annotations

import random
from pathlib import Path

from minivtc.experiments import plots
from minivtc.fairness.cost import W_P
from minivtc.sim import metrics
from minivtc.sim.simulator import simulate
from minivtc.sim.workloads import TraceRequest

__all__ = ["CLIENTS", "RUNS", "SYSTEM_PROMPT", "WINDOW", "prefix_caching", "shared_prompt_trace"]

SYSTEM_PROMPT = 1500  # tokens
RATE = 4.0  # requests per second per client: all three stay backlogged
DURATION = 300.0  # seconds of arrivals
WINDOW = (60.0, 300.0)  # the service-rate window (after the warm-up, as the paper's)
CLIENTS = "ABC"
RUNS = ((False, None), (True, W_P), (True, W_P / 2), (True, 0.0))


def shared_prompt_trace(sharing: str, seed: int = 0) -> list[TraceRequest]:
    """Every client's Poisson arrivals at RATE; the clients in `sharing` prefix each prompt
    with the same SYSTEM_PROMPT tokens, the others send short unique prompts."""
    rng, trace = random.Random(seed), []
    for client in CLIENTS:
        t = rng.expovariate(RATE)
        while t < DURATION:
            own, output = rng.randint(20, 200), rng.randint(20, 200)
            if client in sharing:
                trace.append(
                    TraceRequest(
                        client, t, SYSTEM_PROMPT + own, output, None, "system", SYSTEM_PROMPT
                    )
                )
            else:
                trace.append(TraceRequest(client, t, 100 + own, output))
            t += rng.expovariate(RATE)
    return trace


def prefix_caching(out: Path, show: bool = False) -> list[str]:
    lines = [
        "## Prefix caching: what should a cached prompt token cost?",
        "",
        f"Three clients each send {RATE:g} requests/s for {DURATION:.0f} s (20-200 tokens "
        f"of their own prompt, 20-200 output tokens) into a 10,000-token pool (blocks of "
        f"16, `a10g-llama7b` step times), VTC. *Service* is per second over {WINDOW[0]:.0f}-"
        f"{WINDOW[1]:.0f} s, w_p per prompt token, cached or not, and w_q per output "
        "token (what a client gets); *gap* is the worst backlogged service gap, priced "
        "as the counters price it (a cached prompt token at w_c), within Theorem 4.4's "
        "2U, which caching leaves unchanged. The miss that fills the cache is paid by the "
        "request that computes the prefix (w_p per token, as without a cache); every "
        "later hit pays w_c, whichever client sends it: with two clients sharing a "
        "prefix, the first to send it pays for both. Lemma 4.3 held after every step of "
        "every run (asserted).",
        "",
    ]
    speedups, within, panels = [], True, {}
    workloads = (
        ("A", f"A sends a {SYSTEM_PROMPT:,}-token system prompt with every request"),
        ("AB", "A and B share one system prompt"),
    )
    for sharing, title in workloads:
        rows, speedup, ok, panels[title] = compare(shared_prompt_trace(sharing), show)
        speedups.append(speedup)
        within &= ok
        lines += [
            f"### {title}",
            "",
            "| prefix cache | w_c | tokens/s | hit rate | service A / B / C (per s) | gap | 2U |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
        ]
    plots.shares_plot(
        panels,
        list(CLIENTS),
        out / "prefix_caching_service.png",
        f"service per client, {WINDOW[0]:.0f}-{WINDOW[1]:.0f} s, by cached weight",
    )
    lines += ["![prefix caching: service per client](prefix_caching_service.png)", ""]
    lines += [
        "**Verdict:** the prefix cache serves "
        f"{' and '.join(f'{s:.2f}x' for s in speedups)} the tokens/s of no cache (goal >= "
        f"1.5x), every gap within 2U: {'yes' if min(speedups) >= 1.5 and within else 'NO'}. "
        "With w_c = w_p caching is invisible to fairness: every client gets the same "
        "service and the cache's gain is shared equally. The smaller w_c, the more the "
        "clients whose prompts hit the cache receive, at the others' expense: at w_c = 0 "
        "the others get less than with no cache at all. A cached prefix is still read "
        "by attention at every decode step of its request, and w_c = 0 prices none of "
        "that work.",
        "",
    ]
    return lines


def compare(
    trace: list[TraceRequest], show: bool
) -> tuple[list[str], float, bool, dict[str, list[float]]]:
    """The table's rows, caching's worst speedup, every gap within 2U, each run's shares."""
    rows, throughput, within, shares = [], {}, True, {}
    for cache, w_c in RUNS:
        r = simulate(
            trace,
            "vtc",
            kv_tokens=10000,
            block_size=16,
            reservation="full",
            check_fairness=True,
            watch_backlog=True,
            prefix_caching=cache,
            cached_weight=w_c if cache else None,
            progress=show,
        )
        table = metrics.table_metrics(r.served, r.total_time)
        throughput[cache, w_c] = table.throughput
        rate = metrics.service(r.served, *WINDOW)  # every prompt token at w_p, cached or not
        span = WINDOW[1] - WINDOW[0]
        per_client = [rate.get(c, 0.0) / span for c in CLIENTS]
        shares["no cache" if not cache else f"w_c = {w_c:g}"] = per_client
        service = " / ".join(f"{v:.0f}" for v in per_client)
        within &= r.backlogged_gap is not None and r.bound is not None
        within &= (r.backlogged_gap or 0.0) <= (r.bound or 0.0)
        rows.append(
            f"| {'yes' if cache else 'no'} | {'-' if not cache else f'{w_c:g}'} | "
            f"{table.throughput:.0f} | {r.prefix_hit_rate:.0%} | {service} | "
            f"{r.backlogged_gap:,.0f} | {r.bound:,.0f} |"
        )
    speedup = min(throughput[c] for c in RUNS if c[0]) / throughput[False, None]
    return rows, speedup, within, shares
