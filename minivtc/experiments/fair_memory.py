"""The fair-memory experiment (the paper's Appendix C.3 asks for fair preemption): reserving a
request's whole limit, against KV blocks on demand with preemption, and what each does to the
fairness bound.

Owns `fair_memory(out)`, a section of `minivtc reproduce` (`--only fair_memory`), in three
parts, every run under VTC with its bound asserted after every step (`check_fairness`) where
one is stated, and the worst service gap of two backlogged clients measured (`BacklogWatch`):

1. the paper's 27-client trace with every request asking for up to 1024 tokens (`max_tokens`;
   each still ends at its traced length, with EOS), a 10,000-token pool and A10G step times:
   full reservation, the artifact's peak check, blocks on demand with the latest victim and
   with the fair victim (its default gap, w_q M / 4, and a tighter one);
   with recompute, and the fair victim swapping to host memory instead (PCIe time charged);
2. Theorem 4.8's construction (F fills a 100-token pool with one long request; F and G then
   flood): its non-preemptive gap of about w_q M, against fair preemption's;
3. a workload where the latest victim breaks Theorem 4.4's bound, which the fair one keeps.

Lesson 11 spells part 1 out on the engine itself: `long_trace`, `sim_engine` (simulate()'s
engine, kept to read its `FairnessCheck` afterwards), `full_speed` (full reservation's tokens/s,
the baseline), `gap_run` (one run of the sweep over the preemption gap) and `table_rows` (this
section's table, read back).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

from minivtc.engine.engine import Engine
from minivtc.engine.engine_config import EngineConfig
from minivtc.engine.kv_pool import BlockAllocator
from minivtc.experiments import plots
from minivtc.fairness.cost import W_Q, fairness_bound
from minivtc.fairness.vtc import VTC
from minivtc.sim import metrics
from minivtc.sim.backlog import BacklogWatch
from minivtc.sim.simulator import SIM_EOS, SimResult, StepTimeRunner, VirtualClock, replay, simulate
from minivtc.sim.step_time import MeasuredStepTime, step_time_model
from minivtc.sim.workloads import TraceRequest, workload

__all__ = ["MAX_TOKENS", "POOL", "UNIT_STEP", "fair_memory", "full_speed", "gap_run", "long_trace"]
__all__ += ["number", "table_rows"]

MAX_TOKENS = 1024
POOL = 10000
# (reservation, victim, gap, preemption): the constructions use the first four
RUNS = (
    ("full", "latest", None, "recompute"),
    ("peak", "latest", None, "recompute"),
    ("none", "latest", None, "recompute"),
    ("none", "fair", None, "recompute"),
    ("none", "fair", 1000.0, "recompute"),
    ("none", "fair", None, "swap"),
)
UNIT_STEP = MeasuredStepTime("one second a step", 1.0, 0.0, 0.0, 0.0)  # the theorems' clock
CONSTRUCTION_POOL = 100


def fair_memory(out: Path, show: bool = False) -> list[str]:
    lines = [
        "## Fair memory: reservation against blocks on demand with preemption",
        "",
        "VTC throughout. *Gap* is the worst |W_f - W_g| of two clients over an interval "
        "in which both were backlogged (Definition 4.1), measured from the tokens "
        "served; *bound* is what the configuration guarantees for it: 2U (Theorem 4.4) "
        "with a reservation, 2 U_P = 2 (max(gap, w_p L_input) + w_q B) with fair "
        "preemption (`cost.preemptive_bound`; L_input and B, the most requests one client "
        "ran at once, as the run measured them), none with the latest victim or the "
        "artifact's peak check (under which requests that finish early let the others "
        "grow past M: Lemma 4.3 can fail). Each bound was asserted after every step of "
        "its run.",
        "",
    ]
    real, ratio, within = real_trace(out, show)
    construction, shrink = theorem_4_8()
    breaking, broken = latest_breaks_the_bound()
    lines += real + construction + breaking
    lines += [
        "**Verdicts:**",
        "",
        f"- blocks on demand with the fair victim serve {ratio:.2f}x the tokens/s of full "
        f"reservation (goal >= 1.3x) with every backlogged gap within its bound: "
        f"{'yes' if ratio >= 1.3 and within else 'NO'};",
        f"- on Theorem 4.8's construction fair preemption's gap is {shrink:.2f}x the "
        f"non-preemptive one (goal <= 0.5x): {'yes' if shrink <= 0.5 else 'NO'};",
        f"- the latest victim breaks Theorem 4.4's bound where the fair one keeps its "
        f"own: {'yes' if broken else 'NO'}.",
        "",
    ]
    return lines


def long_trace() -> list[TraceRequest]:
    """The paper's real trace, every request allowed `MAX_TOKENS` (each still ends at its
    traced length)."""
    return [dataclasses.replace(t, max_tokens=MAX_TOKENS) for t in workload("real").make()]


def sim_engine(**options) -> tuple[Engine, StepTimeRunner]:
    """simulate()'s engine: A10G step times on a virtual clock, a pool of `POOL` tokens, VTC;
    `options`: the engine's (reservation, victim, preempt_gap, check_fairness)."""
    clock = VirtualClock()
    runner = StepTimeRunner(step_time_model("a10g-llama7b"), clock)
    config = EngineConfig(max_running=1 << 30, **options)
    pool = BlockAllocator(POOL, 1)
    return Engine(runner, pool, VTC(), 1 << 30, SIM_EOS, clock=clock, config=config), runner


def full_speed(trace: list[TraceRequest]) -> float:
    """Full reservation's tokens per second on `trace`: the baseline of the sweep."""
    engine, runner = sim_engine(reservation="full")
    served, _, _ = replay(engine, runner, trace, False, engine.step)
    total = max(s.end_s for s in served) - trace[0].arrival_s
    return metrics.table_metrics(served, total).throughput


def gap_run(trace: list[TraceRequest], gap: float) -> SimpleNamespace:
    """Blocks on demand with the fair victim at `gap`, its bound asserted every step: the
    worst backlogged gap (`BacklogWatch`), the run's `FairnessCheck` (`check`: its bound and
    largest charges), tokens/s, preemptions and recomputed tokens per served token."""
    engine, runner = sim_engine(
        reservation="none", victim="fair", preempt_gap=gap, check_fairness=True
    )
    watch = BacklogWatch(engine)  # steps the engine; the worst backlogged gap, from the tokens
    served, _, _ = replay(engine, runner, trace, False, watch.step)
    total = max(s.end_s for s in served) - trace[0].arrival_s
    tokens = sum(s.input_tokens + s.output_tokens for s in served)
    return SimpleNamespace(
        gap=watch.worst,
        check=engine.fairness,
        bound=engine.fairness.gap_bound() if engine.fairness else None,
        throughput=metrics.table_metrics(served, total).throughput,
        preemptions=engine.num_preemptions,
        recomputed=engine.preemption.recomputed_tokens / tokens,
    )


def table_rows(lines: list[str]) -> dict[str, SimpleNamespace]:
    """Part 1's table, read back from `fair_memory`'s lines: the victim (fair's with its gap),
    or the reservation when it is not on demand, -> speed, gap, bound (None: none stated),
    recomputed tokens and their share of the served ones."""
    rows = {}
    for line in lines[: lines.index(f"### Theorem 4.8's construction, M = {CONSTRUCTION_POOL}")]:
        cells = [c.strip() for c in line.strip("| ").split(" | ")]
        if line.startswith("| ") and cells[2][0].isdigit():
            share = float(cells[7].split("(")[-1].split("%")[0]) / 100
            rows[cells[1] if cells[0] == "none" else cells[0]] = SimpleNamespace(
                speed=number(cells[2]),
                gap=number(cells[4]),
                bound=number(cells[5]),
                recomputed=number(cells[7]),
                share=share,
            )
    return rows


def number(text: str) -> float | None:
    """A table cell's first number ("5,374", "0 (750,836) ..."), or None ("none stated")."""
    return float(text.split()[0].replace(",", "")) if text[0].isdigit() else None


def real_trace(out: Path, show: bool) -> tuple[list[str], float, bool]:
    """Part 1: the rows and their figure, fair's throughput over full reservation's, every gap
    within bound."""
    trace = long_trace()
    lines = [
        f"### The real trace, `max_tokens` {MAX_TOKENS}",
        "",
        f"Every request may generate up to {MAX_TOKENS} tokens and ends at its traced "
        f"length; {POOL:,}-token pool, `a10g-llama7b` step times.",
        "",
        "| reservation | victim (gap) | tokens/s | Max / Avg / Var Diff | gap | bound | "
        "preemptions | recomputed (swapped) tokens |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    throughput, within, bars = {}, True, []
    for reservation, victim, gap, preemption in RUNS:
        r = run(trace, reservation, victim, gap, POOL, "a10g-llama7b", show, preemption)
        m = metrics.table_metrics(r.served, r.total_time)
        tokens = sum(s.input_tokens + s.output_tokens for s in r.served)
        throughput[reservation, victim, gap, preemption] = m.throughput
        moved = r.recomputed_tokens + r.swapped_tokens
        name = {"full": "full reservation", "peak": "peak check"}.get(
            reservation
        ) or f"on demand, {shown(reservation, victim, gap, preemption)}"
        bars.append((name, m.throughput, r.backlogged_gap, r.bound))
        within &= r.bound is None or r.backlogged_gap <= r.bound
        lines.append(
            f"| {reservation} | {shown(reservation, victim, gap, preemption)} | "
            f"{m.throughput:.0f} | {m.max_diff:.1f} / {m.avg_diff:.1f} / "
            f"{m.diff_var:.0f} | {r.backlogged_gap:,.0f} | {bound_text(r)} | "
            f"{r.preemptions} | {moved_text(r)} ({moved / tokens:.0%} of served) "
            "|"
        )
    ratio = (
        throughput["none", "fair", None, "recompute"]
        / throughput["full", "latest", None, "recompute"]
    )
    plots.tradeoff_plot(
        bars,
        out / "fair_memory_tradeoff.png",
        f"the real trace, max_tokens {MAX_TOKENS}: throughput against fairness",
    )
    lines += ["", "![fair memory: throughput and gap](fair_memory_tradeoff.png)"]
    return lines + [""], ratio, within


def theorem_4_8() -> tuple[list[str], float]:
    """Part 2: F's one long request fills the pool; then three requests each from F and G."""
    m = CONSTRUCTION_POOL
    trace = [TraceRequest("F", 0.0, 1, m - 1)] + [
        TraceRequest(c, 0.5, 1, m - 1) for c in "FG" for _ in range(3)
    ]
    gaps, lines = construction_rows(trace)
    shrink = gaps["none", "fair"] / gaps["full", "latest"]
    intro = [
        f"### Theorem 4.8's construction, M = {m}",
        "",
        f"F sends one request of 1 + {m - 1} tokens, which fills the pool; a moment "
        f"later F and G send three more each. Every step takes one second. Any "
        f"non-preemptive, work-conserving policy leaves G about w_q M = {W_Q * m:.0f} "
        "behind; the fair victim displaces F's requests once F leads by its gap, "
        f"w_q M / 4 = {W_Q * m / 4:.0f}.",
        "",
    ]
    return intro + lines + [""], shrink


def latest_breaks_the_bound() -> tuple[list[str], bool]:
    """Part 3: F starts 32 long requests; then F and G send 20 each. The latest victim keeps
    preempting G's requests, the newest, while F's grow: G falls further behind than 2U."""
    m = CONSTRUCTION_POOL
    trace = [TraceRequest("F", 0.0, 1, m - 1) for _ in range(32)] + [
        TraceRequest(c, 0.5, 1, m - 1) for c in "FG" for _ in range(20)
    ]
    gaps, lines = construction_rows(trace)
    two_u = 2 * fairness_bound(m - 1, m)
    broken = gaps["none", "latest"] > two_u >= gaps["full", "latest"]
    intro = [
        f"### Where the latest victim breaks the bound, M = {m}",
        "",
        "F starts 32 requests of 1 + 99 tokens; a moment later F and G send 20 each. "
        "Blocks on demand admit G's requests at once, and the latest victim preempts "
        "them, the newest, whenever F's older requests need to grow; G falls behind by "
        f"more than Theorem 4.4's 2U = {two_u:.0f}, which holds with a reservation.",
        "",
    ]
    return intro + lines + [""], broken


def construction_rows(trace: list[TraceRequest]) -> tuple[dict[tuple[str, str], float], list[str]]:
    lines = [
        "| reservation | victim (gap) | F-G gap | bound | preemptions |",
        "| --- | --- | --- | --- | --- |",
    ]
    gaps = {}
    for reservation, victim, gap, preemption in RUNS[:4]:
        r = run(trace, reservation, victim, gap, CONSTRUCTION_POOL, UNIT_STEP, False)
        gaps[reservation, victim] = r.backlogged_gap
        lines.append(
            f"| {reservation} | {shown(reservation, victim, gap, preemption)} | "
            f"{r.backlogged_gap:.0f} | {bound_text(r)} | {r.preemptions} |"
        )
    return gaps, lines


def run(trace, reservation, victim, gap, pool, step_time, show, preemption="recompute"):
    checked = reservation == "full" or victim == "fair"  # where a bound is stated
    on_demand = {"victim": victim, "preempt_gap": gap, "preemption": preemption}
    return simulate(
        trace,
        "vtc",
        step_time,
        pool,
        reservation=reservation,
        **(on_demand if reservation == "none" else {}),
        check_fairness=checked,
        watch_backlog=True,
        progress=show,
    )


def shown(reservation: str, victim: str, gap: float | None, preemption: str) -> str:
    if reservation != "none":
        return "-"
    if victim == "latest":
        return victim
    swap = ", swap" if preemption == "swap" else ""
    return f"fair ({'w_q M / 4' if gap is None else f'{gap:.0f}'}{swap})"


def moved_text(r: SimResult) -> str:
    return f"{r.recomputed_tokens:,}" + (f" ({r.swapped_tokens:,})" if r.swapped_tokens else "")


def bound_text(r: SimResult) -> str:
    return "none stated" if r.bound is None else f"{r.bound:,.0f}"
