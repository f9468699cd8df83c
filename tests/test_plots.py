"""minivtc/harness/plots.py: the lessons' side-by-side panels."""

from __future__ import annotations

import pytest

from minivtc.harness.plots import panels_plot


def test_panels_plot_draws_one_panel_a_title_into_a_png(tmp_path):
    panels = {"left": {"a": ([0, 1], [0, 2]), "b": ([0, 1], [1, 1])}, "right": {"a": ([0], [3])}}
    path = panels_plot(panels, tmp_path / "p.png", "x", "y", shade=(0.2, 0.5, "idle"))
    assert path == tmp_path / "p.png" and path.read_bytes().startswith(b"\x89PNG")
    with pytest.raises(ValueError):  # a line's x and y must pair up
        panels_plot({"one": {"a": ([0, 1], [0])}}, tmp_path / "q.png", "x", "y")
