"""The "lines" the course README states per assignment are the course's own count."""

from __future__ import annotations

from pathlib import Path

from minivtc.course.assignments import ASSIGNMENTS
from minivtc.course.edition import lines_to_write

README = Path(__file__).resolve().parents[1] / "minivtc" / "course" / "README.md"


def stated_lines() -> dict[str, int]:
    """The README's table: assignment -> the first number of its "lines" cell."""
    rows = README.read_text().split("| assignment | the student writes |")[1].split("\n\n")[0]
    stated = {}
    for row in rows.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        stated[cells[0].split()[0]] = int(cells[4].split()[0])
    return stated


def test_the_readme_states_the_lines_the_course_counts():
    counted = {a.key: lines_to_write(a) for a in ASSIGNMENTS if a.key in stated_lines()}
    assert stated_lines() == counted


def test_students_write_the_mechanisms_not_only_glue():
    """Algorithm 2's admission round, making room, the counter structure, the lift's floors,
    each step's charge, the fair victim and fair preemption's lift are the student's (the
    reference answers were once 111 lines of glue)."""
    asked = {q for a in ASSIGNMENTS for _, q in a.functions}
    mechanisms = {
        "admission_round",
        "Engine.make_room",
        "VTC.on_decode",
        "LeastCounter.least",
        "LeastCounter.push",
        "VTC.join_floor",
        "VTC.lift_floor",
        "VTC.charge",
        "Fair.choose",
        "Fair.displace",
        "FairLift.floor",
    }
    assert mechanisms <= asked, mechanisms - asked
