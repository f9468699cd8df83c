"""minivtc/course/source.py: where a function starts, and show, which never prints an
assignment's function."""

from __future__ import annotations

import pytest

from minivtc.course.source import asked_for, show, where
from minivtc.engine.engine import Engine
from minivtc.fairness.vtc import VTC


def test_where_names_the_file_and_the_line_the_function_starts_at():
    path, _, rest = where(VTC.add).partition(":")
    line, name = rest.split("  ")
    assert path == "minivtc/fairness/vtc.py" and name == "VTC.add"
    source = open(path).read().splitlines()
    assert source[int(line) - 1].strip().startswith("def add(")


def test_show_prints_the_source_under_its_where_line(capsys):
    show(Engine.schedule)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"# {where(Engine.schedule)}"
    assert printed[1].strip().startswith("def schedule(")


def test_show_refuses_a_function_an_assignment_asks_for(capsys):
    assert asked_for(VTC.lift_counter) and asked_for(Engine.step) and not asked_for(VTC.add)
    with pytest.raises(ValueError, match="assignment"):
        show(VTC.add, VTC.lift_counter)
    assert "def lift_counter" not in capsys.readouterr().out
    show(VTC.add, point_to=[VTC.lift_counter])  # where it starts, and no more
    printed = capsys.readouterr().out
    assert "def lift_counter" not in printed and printed.endswith(f"{where(VTC.lift_counter)}\n")
