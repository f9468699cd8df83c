"""minivtc/experiments/plots.py: the lessons' side-by-side panels."""

from __future__ import annotations

import pytest

from minivtc.experiments.plots import panels_plot


def test_panels_plot_draws_one_panel_a_title_into_a_png(tmp_path):
    panels = {"left": {"a": ([0, 1], [0, 2]), "b": ([0, 1], [1, 1])}, "right": {"a": ([0], [3])}}
    path = panels_plot(panels, tmp_path / "p.png", "x", "y", shade=(0.2, 0.5, "idle"))
    assert path == tmp_path / "p.png" and path.read_bytes().startswith(b"\x89PNG")
    with pytest.raises(ValueError):  # a line's x and y must pair up
        panels_plot({"one": {"a": ([0, 1], [0])}}, tmp_path / "q.png", "x", "y")


def test_the_gap_sweep_and_the_difference_curves_draw(tmp_path):
    from types import SimpleNamespace

    from minivtc.experiments.plots import difference_plot, gap_sweep_plot

    sweep = {
        g: SimpleNamespace(gap=g / 2, bound=2 * g, throughput=100.0, recomputed=0.5)
        for g in (250.0, 1000.0)
    }
    assert gap_sweep_plot(sweep, 40000, 90.0, tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    nan = float("nan")
    panels = {"left": {"a: gap 3": ([0, 1, 3], [nan, 1, 3])}, "right": {"b": ([0, 2], [0, 2])}}
    marks = {"left": (2.0, "w_q M"), "right": (4.0, "2U")}
    path = difference_plot(panels, marks, tmp_path / "d.png", {"right": ((0, 1), (0, 5))})
    assert path.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(KeyError):  # every panel needs its mark
        difference_plot(panels, {"left": (2.0, "w_q M")}, tmp_path / "e.png")
