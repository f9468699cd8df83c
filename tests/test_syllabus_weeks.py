"""Each lesson runs in its own week; each graded line and problem is due after its lesson.

Read from lessons/SYLLABUS.md (the weeks table: which week holds each lesson and problem set;
the assignments table: each assignment's due week; the lessons table: the week each lesson runs
from in the student edition) and from the assignments' metadata (each rubric line names the
lesson that teaches it, `assignments.Line.lesson`) and the problem sets' "Lessons first" line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from minivtc.course.assignments import A4_RUBRIC, A4B_RUBRIC, ASSIGNMENTS, Assignment

LESSONS = Path(__file__).parent.parent / "lessons"
SYLLABUS = (LESSONS / "SYLLABUS.md").read_text()


def table(section: str, first_header: str) -> tuple[list[str], list[list[str]]]:
    """The first markdown table after the heading `section` whose header starts with
    `first_header`: its header's cells and its rows' cells."""
    lines = SYLLABUS.split(section, 1)[1].splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.startswith(f"| {first_header} |") and lines[i + 1].startswith("| ---"):
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append([c.strip() for c in row.strip().strip("|").split("|")])
            return [c.strip() for c in line.strip().strip("|").split("|")], rows
    raise AssertionError(f"no table headed '{first_header}' under {section}")


def notebook_weeks() -> dict[str, int]:
    """Each notebook the weeks table links (00_tour.ipynb, problems/01_...) -> its week."""
    _, rows = table("## The weeks", "week")
    return {
        link: int(row[0])
        for row in rows
        for link in re.findall(r"\]\(((?:problems/)?\d\d_[\w.]+\.ipynb)\)", row[1])
    }


def lesson_weeks() -> dict[int, int]:
    return {int(name[:2]): week for name, week in notebook_weeks().items() if "/" not in name}


def due_weeks() -> dict[str, int]:
    header, rows = table("## The assignments", "assignment")
    due = header.index("due (end of week)")
    return {row[0]: int(row[due]) for row in rows}


def late_lines(assignments, lessons: dict[int, int], due: dict[str, int]) -> list[str]:
    """Every rubric line due before the week of the lesson that teaches it, or naming none."""
    found = []
    for a in assignments:
        for line in a.rubric:
            if line.lesson is None or lessons[line.lesson] > due[a.key]:
                week = lessons.get(line.lesson)
                found.append(
                    f"{a.key} (due week {due[a.key]}): {line.mechanism!r}, Lesson "
                    f"{line.lesson} (week {week})"
                )
    return found


def test_every_rubric_line_is_due_after_the_lesson_that_teaches_it():
    due = due_weeks()
    assert set(due) == {a.key for a in ASSIGNMENTS}, "every assignment has its row, and no other"
    assert not late_lines(ASSIGNMENTS, lesson_weeks(), due)


def test_the_check_finds_a_line_due_before_its_lesson():
    """a4 as it was: Lessons 8-13's lines under a4, due in week 6."""
    (a4,) = [a for a in ASSIGNMENTS if a.key == "a4_vtc"]
    old = Assignment(a4.key, a4.title, a4.functions, A4_RUBRIC + A4B_RUBRIC, 2.5, a4.teaches)
    late = late_lines([old], lesson_weeks(), due_weeks())
    assert len(late) == len(A4B_RUBRIC) and all("a4_vtc (due week 6)" in x for x in late), late


def lessons_first(notebook: Path) -> list[int]:
    """The lessons a problem set names first ("**Lessons first:** 5 (...), 8 (...)")."""
    text = "".join(json.loads(notebook.read_text())["cells"][0]["source"])
    statement = text.split("**Lessons first:**", 1)[1].split(";")[0].split(". ")[0]
    return [int(n) for n in re.findall(r"(\d+)\s\(", statement)]


def test_every_problem_set_comes_after_the_lessons_it_names_first():
    lessons = lesson_weeks()
    sets = {name: week for name, week in notebook_weeks().items() if "/" in name}
    assert len(sets) == 2
    for name, week in sets.items():
        first = lessons_first(LESSONS / name)
        assert first, name
        assert all(lessons[n] <= week for n in first), (name, week, first)
    assert 11 in lessons_first(LESSONS / "problems/02_drr_and_the_fleet.ipynb")  # U_P


def test_every_lesson_runs_from_its_own_week():
    header, rows = table("## Each lesson", "notebook")
    column = header.index("runs from week")
    weeks = notebook_weeks()
    runs = {re.search(r"\]\(([^)]+)\)", row[0])[1]: int(row[column]) for row in rows}
    assert runs == weeks
