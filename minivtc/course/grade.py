"""Grading: each assignment's graded tests, run on the reference with the student's functions.

Owns `grade(edition, out)`. For each assignment it builds a scratch copy of the reference
package for the tests and another for the student's code, puts in the latter the edition's
versions of that assignment's functions and the helpers the student added beside them
(`surgery.take`), and runs its `test_files` with a time limit, in a fresh Python process: on the
tests' copy, the student's code running in a sandbox over the student's copy, called through the
channel (`CHANNEL`: `caller.py`, `sandbox.py`). The instructor's own code (the reference; the
grader's own checks, forked from a warm process: `warm.py`) runs without a sandbox. The points
are the sum of its rubric's lines (`assignments.Line`: a mechanism, its points, its tests) whose
tests all passed: a mechanism's points are lost when any of its tests fails, or does not run. A
submission that does not parse, lacks a function, crashes the interpreter, hangs or prints
garbage scores 0 for that assignment, with the reason in its note, and never stops the grader.
Each failed test is reported by a name written for the student, its rubric line and its first
assertion message (`feedback.py`). Writes `grades.json`: `{"assignments": [{"name", "points",
"max_points", "passed", "tests", "note", "rubric": [{"mechanism", "points", "max_points",
"failed"}], "failures": [{"test", "name", "message", "mechanism"}], "reported"}], "total",
"max_total"}`; "reported" holds what the tests report to the student pass or fail (a6's slack:
its stated bound over its worst gap), printed under the assignment in the table. `edition=None`
grades the reference itself (it must score full marks).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from minivtc.course import sandbox
from minivtc.course.assignments import ASSIGNMENTS, Assignment
from minivtc.course.channel import TIMED_OUT
from minivtc.course.edition import PACKAGE, RELEASED, REPOSITORY
from minivtc.course.feedback import read_regular, read_report, read_reported
from minivtc.course.rules import put_out_of_reach, refusals
from minivtc.course.surgery import take
from minivtc.course.testrun import (
    SPEC,
    TIME_LIMIT_S,
    How,
    boxed,
    launch,
    pytest_args,
    spec,
)

__all__ = ["CHANNEL", "How", "LIVE", "grade", "grade_one", "rubric", "table", "test_edition"]
CHANNEL = frozenset(a.key for a in ASSIGNMENTS)  # tests outside the sandbox: every assignment
# Live: the classes whose objects stay in the sandbox between calls (a6, d1, d2: their own file's)
VTC = ("minivtc.fairness.vtc:VTC",)
LIVE = {"a4_vtc": VTC, "a4b_variants": VTC, "a6_fair": (), "d1_quota": (), "d2_tenants": ()}
LIVE_TIME = 2.5  # their time limit's factor: a live policy answers every call (README: counts)
# The tests' side's copy of a file the student writes whole: empty (its classes and functions
# are the worker's, `caller.Session.stand_ins`), so nothing of the reference's answer is there
OWN_FILE = '"""The student\'s file: what it defines runs in the sandbox."""\n'
REPORT_BYTES = 4 << 20  # a report larger than this is not read (the reference's: ~20 KB)


@dataclass
class Grade:
    name: str
    points: float
    max_points: int
    passed: int
    tests: int
    note: str = ""
    failures: list[dict] = field(default_factory=list)  # {"test", "name", "message", "mechanism"}
    rubric: list[dict] = field(
        default_factory=list
    )  # {"mechanism", "points", "max_points", "failed"}
    output: str = field(default="", repr=False)  # pytest's, for --verbose (not saved)
    reported: list[str] = field(default_factory=list)  # the tests' numbers, pass or fail


def grade(
    edition: str | Path | None,
    out: str | Path,
    time_limit_s: float = TIME_LIMIT_S,
    only: list[str] | None = None,
    echo: Callable[[str, str], None] | None = None,
    trust_submissions: bool = False,
) -> dict:
    """Grade `edition` (a directory made by `release`, with the student's work) or, with None,
    the reference; write `out/grades.json` and return its contents. `echo(key, output)` is
    given each assignment's full pytest output (`--verbose`). A student's code runs in a
    sandbox (`sandbox.py`); where none starts, an edition is graded only with
    `trust_submissions`."""
    out = Path(out)
    chosen = [a for a in ASSIGNMENTS if only is None or a.key in only]
    how = How(time_limit_s, trusted=edition is None or trust_submissions)
    if not how.trusted and (why := sandbox.why_not()) is not None:
        raise ValueError(
            f"cannot sandbox a student's code on this machine: {why}. Grading runs it; "
            "without a sandbox it could read and write what you can. Grade only work you "
            "trust with --trust-submissions"
        )
    out.mkdir(parents=True, exist_ok=True)
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
    a: Assignment, edition: Path | None, how: How | None = None, whole: tuple[str, ...] = ()
) -> Grade:
    """`whole`: files (under minivtc/) taken from `edition` as they are, besides the
    assignment's own (the grader's check: a mutated answer beside the file that uses it)."""
    how = how or How()
    with tempfile.TemporaryDirectory(prefix=f"minivtc-grade-{a.key}-") as scratch:
        tests = copy_package(PACKAGE, Path(scratch) / "tests", REPOSITORY / "weights")
        if edition is None:
            return run_tests(a, tests, how)
        if how.trusted:  # the student's functions put into the tests' own package
            return submit(a, edition, tests, how, whole)
        student = copy_package(PACKAGE, Path(scratch) / "student", None)
        shutil.rmtree(student / "minivtc/course/instructor")  # (d1's, d2's hidden seed)
        return submit(a, edition, student, how, whole, tests, REPOSITORY / "weights")


def copy_package(package: Path, root: Path, weights: Path | None) -> Path:
    """A scratch copy of `package` at root/minivtc; `weights` linked beside it (for the
    tests' side only: never into the sandbox, where a link would show the checkout)."""
    shutil.copytree(
        package, root / "minivtc", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    if weights is not None and weights.is_dir():
        (root / "weights").symlink_to(weights)
    return root


def submit(
    a: Assignment,
    edition: Path,
    root: Path,
    how: How,
    whole: tuple[str, ...],
    tests: Path | None = None,
    weights: Path | None = None,
) -> Grade:
    """`a`'s code from `edition` put into the package at `root` (`take_submission`), then its
    tests: on `tests`, the student's code running in a sandbox over `root` (`CHANNEL`), or
    the tests with it in the sandbox (`weights` seen there), or, trusted, on `root` itself.
    A submission refused by a rule scores 0, the rule named in the note."""
    try:
        notes = take_submission(a, edition, root, whole)
    except (OSError, ValueError, SyntaxError, UnicodeDecodeError) as e:
        return zero(a, f"could not take your code: {e}")
    refused = [n for n in notes if n.startswith("refused: ")]
    if refused:
        return zero(a, "; ".join(refused))
    if tests is None:
        grade = run_tests(a, root, how)
    elif a.key in CHANNEL:
        if a.own_file is not None:  # the tests meet only what the worker says the file holds
            (tests / "minivtc" / a.own_file).write_text(OWN_FILE)
        grade = run_tests(a, tests, how, root)
    else:
        grade = run_in_sandbox(a, root, how, weights)
    grade.note = "; ".join([grade.note] * bool(grade.note) + notes)
    return grade


def take_submission(a: Assignment, edition: Path, root: Path, whole: tuple[str, ...]) -> list[str]:
    """Put `a`'s code from `edition` into the package at `root` (the reference's, or for
    `course test` the edition's as released): its functions and the student's helpers
    (`surgery.take`), or its own file whole (the capstone, graded with the reference policies
    out of reach: `rules.py`). Returns what of the student's changes was not taken, and why a
    capstone is refused, by name."""
    notes = []
    for file in sorted({f for f, _ in a.functions}):
        target = root / "minivtc" / file
        names = [q for f, q in a.functions if f == file]
        donor = (edition / "minivtc" / file).read_text()
        source, left = take(target.read_text(), donor, names)
        target.write_text(source)
        notes += [f"{file}: {n}" for n in left]
    if a.own_file is not None:
        put_out_of_reach(a, root / "minivtc")
    for file in ((a.own_file,) if a.own_file else ()) + whole:
        text = (edition / "minivtc" / file).read_text()
        compile(text, file, "exec")  # a SyntaxError is the submission's, named in the note
        (root / "minivtc" / file).write_text(text)
        if file == a.own_file:
            notes += refusals(text, whole)
    return notes


def run_tests(a: Assignment, root: Path, how: How, student: Path | None = None) -> Grade:
    """`a`'s graded tests on the package in `root`, in a process of their own outside any
    sandbox. With `student` (a package copy holding the student's code), each function the
    assignment asks for runs there, in a sandbox, called through the channel (`caller.py`):
    the tests, their verdicts and their report stay out of the student's code's reach."""
    if student is not None and a.key in LIVE:
        how = replace(how, time_limit_s=how.time_limit_s * LIVE_TIME)
    with tempfile.TemporaryDirectory(prefix=f"minivtc-report-{a.key}-") as scratch:
        work = Path(scratch)
        args = pytest_args(a, root, work, how)
        env = {}
        if student is not None:
            args = ["-p", "minivtc.course.caller", *args]
            live = {"live": list(LIVE[a.key])} if a.key in LIVE else {}
            env[SPEC] = json.dumps(spec(a, student, how) | live)
        timed_out, output = launch(args, root, work, how, env)
        grade = verdict(a, root, work, how.time_limit_s if timed_out else None, output)
    if any(TIMED_OUT in f["message"] for f in grade.failures):  # a call hung: as a hang
        return zero(a, f"timed out after {how.time_limit_s:g} s (your code did not answer)", output)
    return grade


def verdict(a: Assignment, root: Path, work: Path, timed_out: float | None, output: str) -> Grade:
    """The grade from the tests' report in `work` (read as a bounded regular file);
    `timed_out`: the limit they were cut off at."""
    if timed_out is not None:
        return zero(a, f"timed out after {timed_out:g} s", output)
    tests = [root / "minivtc" / file for file in a.test_files]
    try:
        report = read_regular(work / "report.xml", REPORT_BYTES)
        ran, failures = read_report(report, *tests)
        reported = read_reported(report)
    except (OSError, SyntaxError, AttributeError, TypeError, ValueError):
        return zero(a, "the tests did not run to the end", output)
    return scored(a, ran, failures, output, reported)


def run_in_sandbox(a: Assignment, root: Path, how: How, weights: Path | None) -> Grade:
    """`a`'s graded tests in the sandbox with the student's code (not in `CHANNEL`): nothing
    outside is reached or left running, but their report, written there, could be forged."""
    with tempfile.TemporaryDirectory(prefix=f"minivtc-exchange-{a.key}-") as scratch:
        work = Path(scratch)
        box = sandbox.Sandbox(root, work, weights if weights and weights.is_dir() else None)
        args = pytest_args(a, sandbox.INSIDE, sandbox.EXCHANGE, how)
        timed_out, output = boxed(box, args, how.time_limit_s)
        return verdict(a, root, work, how.time_limit_s if timed_out else None, output)


def scored(
    a: Assignment, ran: list[str], failures: list, output: str, reported: list[str]
) -> Grade:
    total = len(ran)
    failed = [{**asdict(f), "mechanism": mechanism(a, f.test)} for f in failures]
    lines = rubric(a, ran, failed)
    points = float(sum(line["points"] for line in lines))
    passed = total - len(failures)
    return Grade(a.key, points, a.max_points, passed, total, "", failed, lines, output, reported)


def zero(a: Assignment, note: str, output: str = "") -> Grade:
    """No points, every rubric line lost, for the reason in `note`."""
    lines = [
        {"mechanism": x.mechanism, "points": 0, "max_points": x.points, "failed": [note]}
        for x in a.rubric
    ]
    return Grade(a.key, 0.0, a.max_points, 0, 0, note, [], lines, output)


def mechanism(a: Assignment, test: str) -> str:
    line = a.line_of(test)
    return line.mechanism if line is not None else "(a test outside the rubric)"


def rubric(a: Assignment, ran: list[str], failed: list[dict]) -> list[dict]:
    """Each rubric line with its points: all of them, or none when one of its tests failed or
    never ran (a test that did not run cannot vouch for the mechanism)."""
    lines = []
    for line in a.rubric:
        lost = sorted({f["name"] for f in failed if f["mechanism"] == line.mechanism})
        absent = [t for t in line.tests if not any(r.partition("[")[0] == t for r in ran)]
        lost += [f"{t.removeprefix('test_').replace('_', ' ')} (did not run)" for t in absent]
        points = 0 if lost else line.points
        lines.append(
            {
                "mechanism": line.mechanism,
                "points": points,
                "max_points": line.points,
                "failed": lost,
            }
        )
    return lines


def test_edition(key: str, edition: str | Path, time_limit_s: float = TIME_LIMIT_S) -> dict:
    """`key`'s graded tests on `edition`'s own package (`minivtc course test`), taken as the
    grader takes it, through the same sandbox and channel: the assignments' files as released
    (`released/`, kept by `release`), `key`'s functions and helpers put in by the same rules
    (`take_submission`), every other assignment's functions on the staff's compiled answers
    (`How.staffed`) as grading runs the reference's, whatever else the student wrote. Where no
    sandbox starts, the student's code runs unsandboxed."""
    (a,) = [a for a in ASSIGNMENTS if a.key == key]
    edition = Path(edition).resolve()
    how = How(time_limit_s, trusted=sandbox.why_not() is not None, staffed=True)
    with tempfile.TemporaryDirectory(prefix=f"minivtc-test-{key}-") as scratch:
        tests = copy_package(edition / "minivtc", Path(scratch) / "tests", edition / "weights")
        student = copy_package(edition / "minivtc", Path(scratch) / "student", None)
        released = edition / RELEASED
        for file in sorted({f for x in ASSIGNMENTS for f, _ in x.functions}):
            if not (released / file).is_file():
                raise ValueError(
                    f"{released / file} is missing: the edition keeps its files as released "
                    "there (`minivtc course release`), to take your code as the grader does"
                )
            for root in (tests, student):
                shutil.copyfile(released / file, root / "minivtc" / file)
        if how.trusted:
            return summary([submit(a, edition, tests, how, ())])
        return summary([submit(a, edition, student, how, (), tests, edition / "weights")])


def table(result: dict) -> str:
    """The grades as a text table, for the terminal: under each assignment its rubric's lines
    (points of max, the mechanism), and under a line that lost its points, each failed test
    with its first message; then what its tests reported, pass or fail (a6's slack)."""
    rows = [f"{'assignment':<14} {'points':>7} {'max':>5} {'tests passed':>13}  note"]
    for g in result["assignments"]:
        rows.append(
            f"{g['name']:<14} {g['points']:>7.1f} {g['max_points']:>5} "
            f"{g['passed']:>6}/{g['tests']:<6}  {g['note']}"
        )
        failures = g.get("failures", [])
        for line in g.get("rubric", []):
            rows.append(f"    {line['points']:>2}/{line['max_points']:<2} {line['mechanism']}")
            rows += [
                f"        failed: {f['name']}: {f['message']}"
                for f in failures
                if f["mechanism"] == line["mechanism"]
            ]
            rows += [f"        failed: {n}" for n in line["failed"] if n.endswith("(did not run)")]
        rows += [
            f"    failed: {f['name']}: {f['message']}"
            for f in failures
            if all(f["mechanism"] != line["mechanism"] for line in g.get("rubric", []))
        ]
        rows += [f"    reported: {text}" for text in g.get("reported", [])]
    rows.append(f"{'total':<14} {result['total']:>7.1f} {result['max_total']:>5}")
    return "\n".join(rows)
