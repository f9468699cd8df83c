"""Grading: each assignment's graded tests, run on the reference with the student's functions.

Owns `grade(edition, out)`. For each assignment it builds a scratch copy of the reference
package, puts in the edition's versions of that assignment's functions (`edition.splice`), and
runs `graded/test_<key>.py` there in a fresh Python process with a time limit. The points are
the assignment's share of its tests that passed. A submission that does not parse, lacks a
function, crashes the interpreter, hangs or prints garbage scores 0 for that assignment and
never stops the grader. Writes `grades.json`:
`{"assignments": [{"name", "points", "max_points", "passed", "tests", "note"}], "total",
"max_total"}`. `edition=None` grades the reference itself (it must score full marks).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

from minivtc.course.assignments import ASSIGNMENTS, Assignment
from minivtc.course.edition import PACKAGE, REPOSITORY, splice

TIME_LIMIT_S = 240  # per assignment: its tests take seconds; a hang is cut off here


@dataclass
class Grade:
    name: str
    points: float
    max_points: int
    passed: int
    tests: int
    note: str = ""


def grade(
    edition: str | Path | None,
    out: str | Path,
    time_limit_s: float = TIME_LIMIT_S,
    only: list[str] | None = None,
) -> dict:
    """Grade `edition` (a directory made by `release`, with the student's work) or, with None,
    the reference; write `out/grades.json` and return its contents."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    chosen = [a for a in ASSIGNMENTS if only is None or a.key in only]
    grades = [grade_one(a, Path(edition) if edition else None, time_limit_s) for a in chosen]
    result = {
        "assignments": [asdict(g) for g in grades],
        "total": round(sum(g.points for g in grades), 1),
        "max_total": sum(g.max_points for g in grades),
    }
    (out / "grades.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def grade_one(a: Assignment, edition: Path | None, time_limit_s: float) -> Grade:
    with tempfile.TemporaryDirectory(prefix=f"minivtc-grade-{a.key}-") as scratch:
        root = Path(scratch)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        shutil.copytree(PACKAGE, root / "minivtc", ignore=ignore)
        (root / "weights").symlink_to(REPOSITORY / "weights")  # the bundled model, read-only
        try:
            for file, qualname in a.functions if edition is not None else ():
                assert edition is not None
                target = root / "minivtc" / file
                donor = (edition / "minivtc" / file).read_text()
                target.write_text(splice(target.read_text(), donor, qualname))
        except (OSError, ValueError, SyntaxError, UnicodeDecodeError) as e:
            return Grade(a.key, 0.0, a.max_points, 0, 0, f"could not take your code: {e}")
        return run_tests(a, root, time_limit_s)


def run_tests(a: Assignment, root: Path, time_limit_s: float) -> Grade:
    report = root / "report.xml"
    tests = root / "minivtc" / "course" / "graded" / f"test_{a.key}.py"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={report}",
        str(tests),
    ]
    env = {**os.environ, "PYTHONPATH": str(root)}  # the scratch package first on the path
    try:
        subprocess.run(command, cwd=root, env=env, capture_output=True, timeout=time_limit_s)
    except subprocess.TimeoutExpired:
        return Grade(a.key, 0.0, a.max_points, 0, 0, f"timed out after {time_limit_s:g} s")
    try:
        root_element = ET.parse(report).getroot()
        found = root_element if root_element.tag == "testsuite" else root_element.find("testsuite")
        if found is None:
            raise ValueError("no testsuite in the report")
        suite = found
        total = int(suite.get("tests", 0))
        failed = sum(int(suite.get(k, 0)) for k in ("failures", "errors", "skipped"))
    except (OSError, ET.ParseError, AttributeError, TypeError, ValueError):
        return Grade(a.key, 0.0, a.max_points, 0, 0, "the tests did not run to the end")
    passed = total - failed
    points = round(a.max_points * passed / total, 1) if total else 0.0
    return Grade(a.key, points, a.max_points, passed, total)


def table(result: dict) -> str:
    """The grades as a text table, for the terminal."""
    rows = [f"{'assignment':<14} {'points':>7} {'max':>5} {'tests passed':>13}  note"]
    for g in result["assignments"]:
        rows.append(
            f"{g['name']:<14} {g['points']:>7.1f} {g['max_points']:>5} "
            f"{g['passed']:>6}/{g['tests']:<6}  {g['note']}"
        )
    rows.append(f"{'total':<14} {result['total']:>7.1f} {result['max_total']:>5}")
    return "\n".join(rows)
