"""How an assignment's graded tests run: the process, the sandbox, the channel's settings.

Owns `How` (the options of one run), `launch` (pytest in a fresh process, or forked from this
one for the grader's own checks, cut off at the time limit), `boxed` (pytest inside the
sandbox) and `spec` (what the tests' side needs to start a student's code in the sandbox and
call it: `caller.py`). Does not read reports or give points (`grade.py`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from minivtc.course import sandbox, warm
from minivtc.course.assignments import ASSIGNMENTS, Assignment
from minivtc.course.feedback import read_regular
from minivtc.course.rules import REFERENCE_POLICIES

__all__ = ["How", "SPEC", "STAFF_KEEP", "TIME_LIMIT_S", "boxed", "kept", "launch", "pytest_args"]
__all__ += ["spec"]

TIME_LIMIT_S = 240  # per assignment: its tests take seconds; a hang is cut off here
OUTPUT_BYTES = 1 << 20  # the tests' output kept for --verbose
SPEC = "MINIVTC_SANDBOXED"  # the environment variable `caller.py` reads its settings from
STAFF_KEEP = "--staff-keep"  # `staffed.py`'s option: the functions that keep the student's code


@dataclass(frozen=True)
class How:
    """How to run an assignment's tests: `forked` from a warm process (`warm.py`);
    `first_failure`: stop at the first failed test (the grader's own checks only ask whether
    a submission loses points)."""

    time_limit_s: float = TIME_LIMIT_S
    forked: bool = False
    first_failure: bool = False
    trusted: bool = False  # the instructor's own code (the reference, check-grader): no sandbox
    # `course test` on the student edition: every other assignment's functions run the staff's
    # compiled answers (`staffed.py`), as grading runs the reference's
    staffed: bool = False


def spec(a: Assignment, student: Path, how: How) -> dict:
    """What the tests' side needs to start the student's code (`caller.SPEC`): the package
    copy, the modules to import, the functions to replace, the file written whole, when
    every call must be answered by (a margin before the grader's own limit, so the tests
    still end and report) and, in `course test`, the functions the worker keeps the student's
    (`kept`: it puts the staff's answers into the others)."""
    modules = sorted({module_of(f) for f, _ in a.functions})
    functions = [f"{module_of(f)}:{q}" for f, q in a.functions]
    margin = min(10.0, how.time_limit_s / 4)
    deadline = time.monotonic() + how.time_limit_s - margin
    own = module_of(a.own_file) if a.own_file else None
    found = {"root": str(student), "modules": modules, "functions": functions, "own": own}
    return found | {"deadline": deadline} | ({"staff": kept(a)} if how.staffed else {})


def kept(a: Assignment) -> list[str]:
    """The functions ("file:qualname") that keep the student's code when `course test` runs
    `a` (`How.staffed`; the staff's answers run every other): `a`'s own and, for a file the
    student writes whole, the reference policies', which are out of its reach (`rules.py`:
    their classes there are placeholders, which the staff's code must not go into)."""
    away = {f for x in ASSIGNMENTS for f in x.functions if f[0] in REFERENCE_POLICIES}
    return sorted(f"{file}:{q}" for file, q in set(a.functions) | (away if a.own_file else set()))


def module_of(file: str) -> str:
    return "minivtc." + file.removesuffix(".py").replace("/", ".")


def pytest_args(a: Assignment, package: Path, work: Path, how: How) -> list[str]:
    """pytest's arguments: `a`'s tests in `package`, the report to `work` (both as the
    process that runs them sees them); in `course test`, the plugin that puts the staff's
    answers into every function but `kept(a)`, before the tests are collected."""
    tests = [str(package / "minivtc" / file) for file in a.test_files]
    args = ["-q", "-p", "no:cacheprovider", f"--junitxml={work / 'report.xml'}", *tests]
    args += ["-o", "junit_family=xunit1"]  # xunit2 drops what the tests report (`reported`)
    if how.staffed:
        args += ["-p", "minivtc.course.staffed", f"{STAFF_KEEP}={','.join(kept(a))}"]
    return args + ["-x"] * how.first_failure


def launch(
    args: list[str], root: Path, work: Path, how: How, env: dict[str, str]
) -> tuple[bool, str]:
    """The tests, in a fresh process (or forked from this one: trusted code only), cut off at
    the time limit with everything they started: (timed out?, their output)."""
    log = work / "output.txt"
    if how.forked and not env:
        timed_out = warm.run_pytest(args, root, log, how.time_limit_s)
    else:
        timed_out = run_pytest(args, root, log, how.time_limit_s, env)
    return timed_out, read_regular(log, OUTPUT_BYTES).decode(errors="replace")


def boxed(box: sandbox.Sandbox, args: list[str], time_limit_s: float) -> tuple[bool, str]:
    """pytest with `args` in `box`: (timed out?, its output). The limit covers everything;
    the sandbox and all it started are gone when it returns."""
    with tempfile.TemporaryDirectory(prefix="minivtc-log-") as logs:
        log = Path(logs) / "output.txt"
        timed_out = box.run([sys.executable, "-m", "pytest", *args], log, time_limit_s)
        return timed_out, read_regular(log, OUTPUT_BYTES).decode(errors="replace")


def run_pytest(
    args: list[str], root: Path, log: Path, time_limit_s: float, extra: dict[str, str]
) -> bool:
    """pytest in a fresh process, the scratch package first on its path; True: it timed out
    (killed: the sandbox it started goes with it, `--die-with-parent`)."""
    env = {**os.environ, "PYTHONPATH": str(root), **extra}
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
