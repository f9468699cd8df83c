"""The fair-memory experiment (the paper's Appendix C.3 asks for fair preemption): reserving a
request's whole limit, against KV blocks on demand with preemption, on the real trace.

Owns `fair_memory(out)`, a section of `minivtc reproduce` (`--only fair_memory`): the paper's
27-client trace with every request asking for up to 1024 tokens (`max_tokens`; each still ends
at its traced length, with EOS), a 10,000-token pool and A10G step times, under VTC with full
reservation, the artifact's peak check, and blocks on demand with the latest or the fair
victim. Lemma 4.3 is asserted after every step of every run (`check_fairness`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from minivtc.core.cost import fairness_bound
from minivtc.harness import metrics
from minivtc.harness.sim import simulate
from minivtc.harness.workloads import workload

MAX_TOKENS = 1024
RUNS = (("full", "latest"), ("peak", "latest"), ("none", "latest"), ("none", "fair"))


def fair_memory(out: Path, show: bool = False) -> list[str]:
    trace = [dataclasses.replace(t, max_tokens=MAX_TOKENS) for t in workload("real").make()]
    two_u = 2 * fairness_bound(max(t.input_tokens for t in trace), 10000)
    lines = ["## Fair memory: reservation against blocks on demand with preemption", "",
             f"The real trace, every request asking for up to {MAX_TOKENS} tokens and ending at "
             "its traced length; VTC, 10,000-token pool, `a10g-llama7b` step times. Lemma 4.3 "
             "held after every step of every run (asserted).", "",
             "| reservation | victim | tokens/s | Max / Avg / Var Diff | max acc. gap | "
             "preemptions | recomputed tokens |",
             "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    throughput = {}
    for reservation, victim in RUNS:
        r = simulate(trace, "vtc", reservation=reservation, victim=victim, check_fairness=True,
                     progress=show)  # fmt: skip
        m = metrics.table_metrics(r.served, r.total_time)
        _, gaps = metrics.accumulated_service_diff(r.served, 600)
        tokens = sum(s.input_tokens + s.output_tokens for s in r.served)
        throughput[reservation, victim] = m.throughput
        shown_victim = victim if reservation == "none" else "-"
        lines.append(f"| {reservation} | {shown_victim} | {m.throughput:.0f} | {m.max_diff:.1f} / "
                     f"{m.avg_diff:.1f} / {m.diff_var:.0f} | {max(gaps) / 1e3:.1f}k | "
                     f"{r.preemptions} | {r.recomputed_tokens} "
                     f"({r.recomputed_tokens / tokens:.0%} of served) |")  # fmt: skip
    ratio = throughput["none", "fair"] / throughput["full", "latest"]
    lines += ["", f"**Verdict:** blocks on demand with the fair victim serve {ratio:.2f}x the "
              f"tokens/s of full reservation (goal >= 1.3x): {'yes' if ratio >= 1.3 else 'NO'}. "
              f"Full reservation's service-gap bound is 2U = {two_u:.0f} (Theorem 4.4); the bound "
              "under preemption is not stated yet (Appendix C.3 leaves it open), so the "
              "accumulated gaps above are reported, not judged.", ""]  # fmt: skip
    return lines
