"""The paper's figure types from `requests.csv` records: service, response time, service gap;
and the fair-memory sections' bars (throughput against the gap and its bound; service shares);
the lessons' side-by-side panels (`panels_plot`), fair memory's sweep over the preemption gap
(`gap_sweep_plot`) and W_F - W_G over Theorem 4.8's construction (`difference_plot`).

Owns matplotlib only; every number comes from `metrics.py` or the caller. Each function draws
one figure into a PNG and returns its path. Figures use the Agg backend, so they render without
a screen. Lessons 4-11 show them inline.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from minivtc.sim import metrics
from minivtc.sim.metrics import Served  # noqa: E402

__all__ = ["ablation_plot", "difference_plot", "gap_plot", "gap_sweep_plot", "panels_plot", "plt"]
__all__ += ["response_plot", "save", "service_plot", "shares_plot", "tradeoff_plot"]

MAX_LINES = 8  # more clients than this: plot the busiest ones, say so in the title


def busiest(served: list[Served], n: int = MAX_LINES) -> list[str]:
    counts: dict[str, int] = {}
    for r in served:
        counts[r.client] = counts.get(r.client, 0) + 1
    return sorted(counts, key=lambda c: -counts[c])[:n]


def service_plot(
    served: list[Served], horizon: float, path: str | Path, title: str = "", window: float = 60.0
) -> Path:
    """Service rate per client (weighted tokens/s, 60 s windows), with demand dashed (Fig. 3b)."""
    ticks, rates = metrics.service_rates(served, horizon, window=window)
    _, asks = metrics.demand_rates(served, horizon, window=window)
    shown = busiest(served)
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, c in enumerate(shown):
        color = f"C{i}"
        ax.plot(ticks, rates[c], color=color, label=f"{c} service")
        ax.plot(ticks, asks[c], color=color, linestyle=":", alpha=0.6)
    title = title or f"service rate per client (dotted: demand){more(served, shown)}"
    ax.set(xlabel="time (s)", ylabel="tokens/s  (input + 2 x output)", title=title)
    ax.legend(fontsize=7, ncol=2)
    return save(fig, path)


def response_plot(served: list[Served], horizon: float, path: str | Path, title: str = "") -> Path:
    """Mean first-token latency per client in 60 s windows (the paper's "response time")."""
    ticks, ttft = metrics.response_times(served, horizon)
    shown = busiest(served)
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, c in enumerate(shown):
        ax.plot(ticks, [float("nan") if v is None else v for v in ttft[c]], f"C{i}", label=c)
    ax.set(
        xlabel="time (s)",
        ylabel="mean time to first token (s)",
        title=title or f"response time per client{more(served, shown)}",
    )
    ax.legend(fontsize=7, ncol=2)
    return save(fig, path)


def gap_plot(
    runs: dict[str, list[Served]], horizon: float, path: str | Path, bound: float | None = None
) -> Path:
    """Absolute difference of accumulated service between clients, one line per run (Fig. 3a)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, served) in enumerate(runs.items()):
        ticks, diffs = metrics.accumulated_service_diff(served, horizon)
        ax.plot(ticks, diffs, f"C{i}", marker="o", markersize=3, label=name)
    if bound is not None:
        ax.axhline(bound, color="gray", linestyle="--", label=f"2U = {bound:,.0f}")
    ax.set(
        xlabel="time (s)",
        ylabel="max - min accumulated service (tokens)",
        title="absolute difference in accumulated service",
    )
    ax.legend(fontsize=8)
    return save(fig, path)


def ablation_plot(
    panels: dict[str, dict[str, tuple[list[float], list[float]]]], path: str | Path
) -> Path:
    """Figure 15: one panel per ablation, one line per run: {panel: {run: (ticks, gaps)}}.
    A run named "... measured" is drawn solid, its simulation ("... simulated") dashed in the
    same colour beside it."""
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5), squeeze=False)
    for ax, (title, runs) in zip(axes[0], panels.items(), strict=True):
        colors: dict[str, str] = {}
        for name, (ticks, gaps) in runs.items():
            run, _, kind = name.rpartition(" ")
            color = colors.setdefault(run, f"C{len(colors)}")
            style = "-" if kind == "measured" else "--"
            ax.plot(ticks, [g / 1e3 for g in gaps], color=color, linestyle=style, label=name)
        ax.set(xlabel="time (s)", ylabel="accumulated service gap (k tokens)", title=title)
        ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.15))
    return save(fig, path)


def more(served: list[Served], shown: list[str]) -> str:
    n = len(metrics.clients_of(served))
    return f" ({len(shown)} busiest of {n} clients)" if n > len(shown) else ""


def save(fig, path: str | Path) -> Path:
    path = Path(path)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def tradeoff_plot(
    rows: list[tuple[str, float, float, float | None]], path: str | Path, title: str = ""
) -> Path:
    """One bar pair per configuration `(name, tokens/s, worst backlogged gap, bound or None)`:
    throughput on the left, the gap on the right with its stated bound marked (Fair memory)."""
    names = [r[0] for r in rows]
    y = range(len(rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 0.5 * len(rows) + 1.5), sharey=True)
    left.barh(y, [r[1] for r in rows], color="C0")
    left.set(xlabel="tokens/s", yticks=list(y), yticklabels=names)
    left.invert_yaxis()
    right.barh(y, [r[2] for r in rows], color="C1", label="worst backlogged gap")
    label: str | None = "stated bound"
    for i, (*_, bound) in enumerate(rows):
        if bound is None:
            right.text(0, i, "  no bound", va="center", fontsize=7, color="gray")
            continue
        right.plot([bound, bound], [i - 0.4, i + 0.4], "k-", linewidth=2, label=label)
        label = None  # one legend entry
    right.set(xlabel="service gap (counter units)")
    right.legend(fontsize=7, loc="lower right")
    fig.suptitle(title or "throughput against fairness")
    return save(fig, path)


def shares_plot(
    panels: dict[str, dict[str, list[float]]], clients: list[str], path: str | Path, title: str = ""
) -> Path:
    """Grouped bars: in each panel, for each configuration, every client's service rate."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.5), sharey=True)
    axes = axes if len(panels) > 1 else [axes]
    width = 0.8 / len(clients)
    for ax, (panel, runs) in zip(axes, panels.items(), strict=True):
        for k, client in enumerate(clients):
            ax.bar(
                [i + k * width for i in range(len(runs))],
                [v[k] for v in runs.values()],
                width,
                color=f"C{k}",
                label=client,
            )
        ax.set_xticks([i + width * (len(clients) - 1) / 2 for i in range(len(runs))])
        ax.set_xticklabels(list(runs), fontsize=8)
        ax.set_title(panel, fontsize=9)
    axes[0].set_ylabel("service (tokens/s, input + 2 x output)")
    axes[-1].legend(fontsize=8)
    fig.suptitle(title or "service per client")
    return save(fig, path)


def panels_plot(
    panels: dict[str, dict[str, tuple[Sequence[float], Sequence[float]]]],
    path: str | Path,
    xlabel: str,
    ylabel: str,
    shade: tuple[float, float, str] | None = None,
) -> Path:
    """Side-by-side panels sharing the y axis: `panels` maps each panel's title to its lines,
    label -> (x, y), each label in the same color in every panel; `shade` = (start, end, label)
    greys that stretch of x in each (the lessons' counters and service over time)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), sharey=True)
    axes = [axes] if len(panels) == 1 else list(axes)
    for ax, (title, lines) in zip(axes, panels.items(), strict=True):
        for i, (label, (x, y)) in enumerate(lines.items()):
            ax.plot(x, y, f"C{i}", label=label)
        if shade is not None:
            ax.axvspan(shade[0], shade[1], color="gray", alpha=0.15, label=shade[2])
        ax.set(title=title, xlabel=xlabel)
    axes[0].set_ylabel(ylabel)
    axes[0].legend()
    return save(fig, path)


def gap_sweep_plot(sweep: dict, two_u: float, baseline: float, path: str | Path) -> Path:
    """Fair memory's sweep over the preemption gap (`fair_memory.gap_run` per gap): left, each
    run's bound 2 U_P and measured backlogged gap against full reservation's 2U; right, its
    tokens/s against full reservation's (`baseline`), labelled with the recomputed share."""
    gaps, runs = list(sweep), list(sweep.values())
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(gaps, [s.bound for s in runs], "C1o--", label="bound 2 U_P (this run)")
    left.plot(gaps, [s.gap for s in runs], "C2o-", label="measured backlogged gap")
    left.axhline(two_u, color="C0", ls=":", label="2U (full reservation's bound)")
    left.set(
        xscale="log",
        yscale="log",
        xlabel="preempt_gap",
        title="fairness: the bound follows the gap",
    )
    left.set_ylabel("service gap (weighted tokens)")
    left.legend(fontsize=8)
    right.plot(gaps, [s.throughput for s in runs], "C2o-", label="on demand, fair victim")
    right.axhline(baseline, color="C0", ls=":", label="full reservation")
    right.set(xscale="log", xlabel="preempt_gap", ylabel="tokens/s", ylim=(0, None))
    right.set_title("the price: recomputation")
    for gap, s in sweep.items():
        right.annotate(
            f"{s.recomputed:.0%}",
            (gap, s.throughput),
            textcoords="offset points",
            xytext=(0, -14),
            ha="center",
            fontsize=8,
        )
    right.legend(fontsize=8, loc="lower right")
    right.text(
        0.02, 0.03, "labels: recomputed tokens, % of served", transform=right.transAxes, fontsize=8
    )
    return save(fig, path)


def difference_plot(
    panels: dict[str, dict[str, tuple[Sequence[float], Sequence[float]]]],
    marks: dict[str, tuple[float, str]],
    path: str | Path,
    view: dict[str, tuple[tuple[float, float], tuple[float, float]]] | None = None,
) -> Path:
    """W_F - W_G over the steps (`driver.service_difference`): a panel per title, a curve per
    label as (the whole curve, drawn faint; its backlogged stretches, NaN elsewhere, bold), a
    dashed line at `marks[title]` = (height, label); `view[title]` = (xlim, ylim) zooms."""
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.3))
    for ax, (title, curves) in zip(axes, panels.items(), strict=True):
        for i, (label, (total, both)) in enumerate(curves.items()):
            ax.plot(total, f"C{i}", lw=0.8, alpha=0.35)
            ax.plot(both, f"C{i}", lw=1.6, label=label)
        height, name = marks[title]
        ax.axhline(height, color="gray", ls="--", lw=1, label=name)
        ax.set(title=title, xlabel="step", ylabel="W_F - W_G (weighted tokens)")
        if view and title in view:
            ax.set(xlim=view[title][0], ylim=view[title][1])
        ax.legend(fontsize=8)
    return save(fig, path)
