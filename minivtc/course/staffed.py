"""`minivtc course test`'s pytest plugin: every other assignment on the staff's answers.

Loaded by the test runner (`-p minivtc.course.staffed`, `testrun.pytest_args`) in the student
edition. Before the graded tests are collected, so before they or the student's code import
the package's modules, it puts the staff's compiled answers (`staff.load`) into every
assignment function but those the runner names (`--staff-keep`: the assignment under test's,
`testrun.kept`), so that an assignment is tested on the edition as grading runs it on the
reference: its own functions the student's, every other assignment's the staff's, whatever the
student has written there. The sandbox's worker does the same with the names the runner sends
it (`worker.hello`). Does not decide which functions stay the student's (`testrun.py`).
"""

from __future__ import annotations

import pytest

from minivtc.course import staff

KEEP = "--staff-keep"  # the functions ("file:qualname", comma-separated) that stay the student's


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(KEEP, default="", help="functions that keep the student's code")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    staff.load(str(config.getoption(KEEP)).split(","))
