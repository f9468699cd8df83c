"""Grading: each assignment's graded tests, run on the reference with the student's functions.

Owns `grade(edition, out)`. For each assignment it builds a scratch copy of the reference
package, puts in the edition's versions of that assignment's functions and the helpers the
student added beside them (`edition.take`), and runs `graded/test_<key>.py` there with a time
limit: in a fresh Python process, or (`warm.py`, for the grader's own checks) in a process
forked from one that has the heavy libraries loaded. The points are the assignment's share of
its tests that passed. A submission that does not parse, lacks a function, crashes the
interpreter, hangs or prints garbage scores 0 for that assignment, with the reason in its note,
and never stops the grader. Each failed test is reported by a name written for the student and
its first assertion message (`feedback.py`). Writes `grades.json`:
`{"assignments": [{"name", "points", "max_points", "passed", "tests", "note", "failures":
[{"test", "name", "message"}]}], "total", "max_total"}`. `edition=None` grades the reference
itself (it must score full marks).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from minivtc.course import warm
from minivtc.course.assignments import ASSIGNMENTS, Assignment
from minivtc.course.edition import PACKAGE, REPOSITORY, placeholder, take
from minivtc.course.feedback import read_report

TIME_LIMIT_S = 240  # per assignment: its tests take seconds; a hang is cut off here


@dataclass
class Grade:
    name: str
    points: float
    max_points: int
    passed: int
    tests: int
    note: str = ""
    failures: list[dict] = field(default_factory=list)  # {"test", "name", "message"}
    output: str = field(default="", repr=False)  # pytest's, for --verbose (not saved)


@dataclass(frozen=True)
class How:
    """How to run an assignment's tests: `forked` from a warm process (`warm.py`);
    `first_failure`: stop at the first failed test (the grader's own checks only ask whether
    a submission loses points)."""

    time_limit_s: float = TIME_LIMIT_S
    forked: bool = False
    first_failure: bool = False


def grade(
    edition: str | Path | None,
    out: str | Path,
    time_limit_s: float = TIME_LIMIT_S,
    only: list[str] | None = None,
    echo: Callable[[str, str], None] | None = None,
) -> dict:
    """Grade `edition` (a directory made by `release`, with the student's work) or, with None,
    the reference; write `out/grades.json` and return its contents. `echo(key, output)` is
    given each assignment's full pytest output (`--verbose`)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    chosen = [a for a in ASSIGNMENTS if only is None or a.key in only]
    how = How(time_limit_s)
    grades = []
    for a in chosen:
        grades.append(grade_one(a, Path(edition) if edition else None, how))
        if echo is not None:
            echo(a.key, grades[-1].output)
    result = summary(grades)
    (out / "grades.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def summary(grades: list[Grade]) -> dict:
    saved = [{k: v for k, v in asdict(g).items() if k != "output"} for g in grades]
    return {
        "assignments": saved,
        "total": round(sum(g.points for g in grades), 1),
        "max_total": sum(g.max_points for g in grades),
    }


def grade_one(
    a: Assignment, edition: Path | None, how: How = How(), whole: tuple[str, ...] = ()
) -> Grade:
    """`whole`: files (under minivtc/) taken from `edition` as they are, besides the
    assignment's own (the grader's check: a mutated answer beside the file that uses it)."""
    with tempfile.TemporaryDirectory(prefix=f"minivtc-grade-{a.key}-") as scratch:
        root = Path(scratch)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        shutil.copytree(PACKAGE, root / "minivtc", ignore=ignore)
        (root / "weights").symlink_to(REPOSITORY / "weights")  # the bundled model, read-only
        notes: list[str] = []
        try:
            if edition is not None:
                notes = take_submission(a, edition, root, whole)
        except (OSError, ValueError, SyntaxError, UnicodeDecodeError) as e:
            return Grade(a.key, 0.0, a.max_points, 0, 0, f"could not take your code: {e}")
        grade = run_tests(a, root, how)
        grade.note = "; ".join([grade.note] * bool(grade.note) + notes)
        return grade


def take_submission(a: Assignment, edition: Path, root: Path, whole: tuple[str, ...]) -> list[str]:
    """Put `a`'s code from `edition` into the scratch package at `root`: its functions and the
    student's helpers (`edition.take`), or its own file whole (the capstone, graded without
    the instructor's answer: the edition's placeholder stands in for it, as on the student's
    disk). Returns what of the student's changes was not taken, by name."""
    notes = []
    for file in sorted({f for f, _ in a.functions}):
        target = root / "minivtc" / file
        names = [q for f, q in a.functions if f == file]
        donor = (edition / "minivtc" / file).read_text()
        source, left = take(target.read_text(), donor, names)
        target.write_text(source)
        notes += [f"{file}: {n}" for n in left]
    for file in sorted({f for f, _ in a.answer}):
        (root / "minivtc" / file).write_text(placeholder(a.key))
    for file in ((a.own_file,) if a.own_file else ()) + whole:
        text = (edition / "minivtc" / file).read_text()
        compile(text, file, "exec")  # a SyntaxError is the submission's, named in the note
        (root / "minivtc" / file).write_text(text)
    return notes


def run_tests(a: Assignment, root: Path, how: How, work: Path | None = None) -> Grade:
    """`a`'s graded tests on the package in `root`; the report and output go to `work`."""
    report, log = (work or root) / "report.xml", (work or root) / "output.txt"
    tests = root / "minivtc" / "course" / "graded" / f"test_{a.key}.py"
    args = ["-q", "-p", "no:cacheprovider", f"--junitxml={report}", str(tests)]
    args += ["-x"] * how.first_failure
    if how.forked:
        timed_out = warm.run_pytest(args, root, log, how.time_limit_s)
    else:
        timed_out = run_pytest(args, root, log, how.time_limit_s)
    output = log.read_text(errors="replace") if log.exists() else ""
    if timed_out:
        note = f"timed out after {how.time_limit_s:g} s"
        return Grade(a.key, 0.0, a.max_points, 0, 0, note, output=output)
    try:
        total, failures = read_report(report, tests)
    except (OSError, SyntaxError, AttributeError, TypeError, ValueError):
        note = "the tests did not run to the end"
        return Grade(a.key, 0.0, a.max_points, 0, 0, note, output=output)
    passed = total - len(failures)
    points = round(a.max_points * passed / total, 1) if total else 0.0
    failed = [asdict(f) for f in failures]
    return Grade(a.key, points, a.max_points, passed, total, failures=failed, output=output)


def test_edition(key: str, edition: str | Path, time_limit_s: float = TIME_LIMIT_S) -> dict:
    """`key`'s graded tests on `edition`'s own package as it stands (`minivtc course test`):
    the student's functions with the rest of their edition, nothing of the reference's."""
    (a,) = [a for a in ASSIGNMENTS if a.key == key]
    with tempfile.TemporaryDirectory(prefix=f"minivtc-test-{key}-") as work:
        return summary([run_tests(a, Path(edition).resolve(), How(time_limit_s), Path(work))])


def run_pytest(args: list[str], root: Path, log: Path, time_limit_s: float) -> bool:
    """pytest in a fresh process, the scratch package first on its path; True: it timed out."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    with log.open("wb") as sink:
        try:
            command = [sys.executable, "-m", "pytest", *args]
            subprocess.run(
                command,
                cwd=root,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                timeout=time_limit_s,
            )
        except subprocess.TimeoutExpired:
            return True
    return False


def table(result: dict) -> str:
    """The grades as a text table, for the terminal: each failed test under its assignment."""
    rows = [f"{'assignment':<14} {'points':>7} {'max':>5} {'tests passed':>13}  note"]
    for g in result["assignments"]:
        rows.append(
            f"{g['name']:<14} {g['points']:>7.1f} {g['max_points']:>5} "
            f"{g['passed']:>6}/{g['tests']:<6}  {g['note']}"
        )
        rows += [f"    failed: {f['name']}: {f['message']}" for f in g.get("failures", [])]
    rows.append(f"{'total':<14} {result['total']:>7.1f} {result['max_total']:>5}")
    return "\n".join(rows)
