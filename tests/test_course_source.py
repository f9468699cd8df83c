"""minivtc/course/source.py: where a function starts, show, which never prints an
assignment's function, and task, which prints only what one must do."""

from __future__ import annotations

import pytest

from minivtc.course.source import asked_for, show, task, where
from minivtc.engine.engine import Engine
from minivtc.fairness.scheduler import admission_round
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


def test_task_prints_the_signature_and_docstring_and_no_line_of_the_body(capsys):
    task(admission_round, Engine.make_room)
    printed = capsys.readouterr().out
    assert printed.startswith(f"# {where(admission_round)}\ndef admission_round(")
    assert f"# {where(Engine.make_room)}\ndef make_room(self, request: Request) -> bool:" in printed
    assert "Algorithm 2's admission round" in printed and "Reserve `request`'s blocks" in printed
    for body in ("scheduler.peek()", "scheduler.dispatch(", "self.admission.reserve(", "preempt("):
        assert body not in printed, body
