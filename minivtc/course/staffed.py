"""`minivtc course test`'s pytest plugin: every other assignment on the staff's answers.

Loaded by the test runner (`-p minivtc.course.staffed`, `testrun.pytest_args`) in the student
edition. Before the graded tests are collected, so before they or the student's code import
the package's modules, it puts the staff's compiled answers (`staff.load`) into every
assignment function but those the runner names (`testrun.STAFF_KEEP`: the assignment under
test's, `testrun.kept`), so that an assignment is tested on the edition as grading runs it on
the reference: its own functions the student's, every other assignment's the staff's, whatever
the student has written there. The sandbox's worker does the same with the names the runner
sends it (`worker.hello`). Does not decide which functions stay the student's (`testrun.py`).
"""

from __future__ import annotations

import pytest

from minivtc.course import staff
from minivtc.course.testrun import STAFF_KEEP

__all__ = ["pytest_addoption", "pytest_configure"]  # (pytest's hooks: `-p` loads this module)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(STAFF_KEEP, default="", help="functions that keep the student's code")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    staff.load(str(config.getoption(STAFF_KEEP)).split(","))
