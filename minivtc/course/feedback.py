"""What a student reads about a graded run: each failed test by a name written for them, and
its first assertion message.

Owns `read_regular` (a report or a log, read only if it is a regular file, and only so much of
it: what a sandbox left behind cannot make the grader wait or read elsewhere), `read_report`
(a pytest JUnit XML report: how many tests ran, which failed and why),
`read_reported` (what the tests reported beside passing or failing, e.g. a6's slack) and
`describe` (a test's name for a student: the first sentence of its docstring, else its function
name in words, with its parameters). Does not run anything (`grade.py` does).
"""

from __future__ import annotations

import ast
import os
import stat
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

__all__ = ["read_regular", "read_report", "read_reported"]

MESSAGE_CHARS = 300  # a message longer than this is cut (the full output: `--verbose`)
REPORTED = "reported"  # the property a graded test records a number under for the student


@dataclass(frozen=True)
class Failure:
    test: str  # pytest's name, e.g. test_rotary_positions_match_transformers[theta 1e4]
    name: str  # for a student: "RoPE tables and rotation match transformers' (theta 1e4)"
    message: str  # the first line of its assertion's message


def read_regular(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of `path`, if it is a regular file (not a link, a pipe or a
    device: what a sandbox leaves behind is opened without waiting on it); else b""."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        return os.read(fd, limit) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    finally:
        os.close(fd)


def read_report(report: bytes | Path, *tests_files: Path) -> tuple[list[str], list[Failure]]:
    """(the tests that ran, by pytest's name; the failed ones) from the report (its bytes,
    or a file); raises ValueError if it is unreadable.
    A skipped test counts as failed (its reason is the message)."""
    root = ET.fromstring(report if isinstance(report, bytes) else report.read_bytes())
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise ValueError("no testsuite in the report")
    names = {test: text for file in tests_files for test, text in docstrings(file).items()}
    cases = list(suite.iter("testcase"))
    failures = []
    for case in cases:
        problem = next(
            (case.find(k) for k in ("failure", "error", "skipped") if case.find(k) is not None),
            None,
        )
        if problem is not None:
            test = case.get("name", "?")
            message = first_line(problem.get("message") or problem.text or "")
            failures.append(Failure(test, describe(test, names), message))
    return [case.get("name", "?") for case in cases], failures


def read_reported(report: bytes) -> list[str]:
    """What the tests recorded for the student, pass or fail (`record_property("reported",
    text)`; the report needs junit_family xunit1 to hold it), in the order they ran."""
    root = ET.fromstring(report)
    return [
        prop.get("value", "")
        for case in root.iter("testcase")
        for prop in case.iter("property")
        if prop.get("name") == REPORTED
    ]


def describe(test: str, names: dict[str, str]) -> str:
    """`test` for a student: its docstring's first line (or its name in words), and its
    parameters in parentheses."""
    base, _, params = test.partition("[")
    words = names.get(base) or base.removeprefix("test_").replace("_", " ")
    return f"{words} ({params.rstrip(']')})" if params else words


def docstrings(tests_file: Path) -> dict[str, str]:
    """Each test function's docstring, first sentence, by name (empty if the file is unreadable)."""
    try:
        tree = ast.parse(tests_file.read_text())
    except (OSError, SyntaxError, ValueError):
        return {}
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            doc = " ".join((ast.get_docstring(node) or "").split())
            if doc:
                found[node.name] = doc.split(". ")[0].rstrip(".")  # its first sentence
    return found


def first_line(message: str) -> str:
    """The first line that says something, without pytest's "AssertionError: " prefix."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    line = lines[0] if lines else "(no message)"
    line = line.removeprefix("AssertionError: ")
    return line if len(line) <= MESSAGE_CHARS else line[: MESSAGE_CHARS - 3] + "..."
