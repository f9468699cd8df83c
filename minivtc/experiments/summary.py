"""`summarize`: a simulated run's numbers, as every run directory's metrics.json holds them.

Table 2's metrics (Section 5.1), the paper's Figure 3 gap, Theorem 4.4's backlogged gap beside
the bound the configuration guarantees, and the run's size; one engine's run
(`experiments/report.py`) and each replica of a fleet's (`experiments/fleet_runs.py`) are
summarized alike.
"""

from __future__ import annotations

from minivtc.fairness.cost import fairness_bound
from minivtc.sim import metrics
from minivtc.sim.simulator import SimResult

__all__ = ["summarize"]


def summarize(
    result: SimResult,
    horizon: float,
    kv_tokens: int,
    max_input: int,
    cost: metrics.Cost = metrics.linear_cost,
) -> dict:
    """metrics.json's numbers. `cost` prices service (the "profile" tables use h; their demand
    stays linear, as in the artifact's script for Tables 3-4)."""
    served = result.served
    table = metrics.table_metrics(served, result.total_time, horizon=horizon, cost=cost)
    totals = metrics.service(served, 0.0, float("inf"), cost)
    _, gaps = metrics.accumulated_service_diff(served, horizon, cost=cost)
    half = len(gaps) // 2
    return {
        "served": len(served),
        "rejected": len(result.rejected),
        "max_diff": round(table.max_diff, 2),
        "avg_diff": round(table.avg_diff, 2),
        "diff_var": round(table.diff_var, 2),
        "throughput_tok_s": round(table.throughput, 1),
        # 1 = every client got the same service over the measured span (after the warm-up)
        "jain_index": round(
            metrics.jain_index(metrics.service(served, 30.0, horizon, cost).values()), 4
        ),
        # the paper's Figure 3 gap, over every client, idle ones too: 2U does not bound it
        # (a client that asks for little falls behind by its own choice); backlogged_gap below
        # is what the bound is about
        "max_accumulated_gap": round(max(gaps), 1),
        "max_gap_first_half": round(max(gaps[:half] or gaps), 1),
        "last_gap": round(gaps[-1], 1),
        "two_u": 2 * fairness_bound(max_input, kv_tokens),
        "simulated_s": round(result.total_time, 1),
        "wall_s": round(result.wall_s, 2),
        "steps": result.steps,
        # Theorem 4.4's quantity, measured, and the bound the configuration guarantees it
        # (null: none stated, e.g. FCFS, or blocks on demand with the latest victim)
        "backlogged_gap": None
        if result.backlogged_gap is None
        else round(result.backlogged_gap, 1),
        "bound": None if result.bound is None else round(result.bound, 1),
        "prefix_hit_rate": round(result.prefix_hit_rate, 4),  # of admitted prompt tokens
        "prefill_tokens_saved": result.cached_tokens,
        "preemptions": result.preemptions,
        "recomputed_tokens": result.recomputed_tokens,
        "swapped_tokens": result.swapped_tokens,
        "service_per_client": {c: round(v, 1) for c, v in totals.items()},
        # the paper's comparison window for shares (e.g. Fig. 16, Table 6: 60-300 s), tokens/s
        "service_rate_60_300": {
            c: round(v / 240, 1) for c, v in metrics.service(served, 60, 300, cost).items()
        },
        "mean_ttft_per_client": {c: round(v, 3) for c, v in metrics.mean_ttft(served).items()},
    }
