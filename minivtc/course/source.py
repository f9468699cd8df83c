"""What a lesson prints of the package: a function's source, with the file and line it starts at.

Owns `where` (open the file there) and `show` (print the source under that line). `show` never
prints a function an assignment asks students to write (`assignments.py`): a lesson points at
those (`point_to`, `where`) instead, so its page gives no answer away.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import minivtc
from minivtc.course.assignments import ASSIGNMENTS

__all__ = ["asked_for", "show", "where"]

PACKAGE = Path(minivtc.__file__).parent


def where(function) -> str:
    """`path:line  qualified name`, the path from the repository's root."""
    first = inspect.getsourcelines(function)[1]
    path = Path(inspect.getsourcefile(function) or "").resolve()
    return f"{path.relative_to(PACKAGE.parent)}:{first}  {function.__qualname__}"


def show(*functions, point_to=()) -> None:
    """Print each function's source under its `where` line; then, for `point_to`, only where
    each starts (what to read in the file, an assignment's functions among them)."""
    for function in functions:
        if asked_for(function):
            raise ValueError(f"{function.__qualname__} is an assignment's: pass it as point_to")
        print(f"# {where(function)}")
        print(inspect.getsource(function))
    if point_to:
        print("To read in the file:")
    for function in point_to:
        print("   ", where(function))


def asked_for(function) -> bool:
    """Whether an assignment asks students to write `function` (or the capstone's answer is it)."""
    path = Path(inspect.getsourcefile(function) or "").resolve()
    if not path.is_relative_to(PACKAGE):
        return False
    file = path.relative_to(PACKAGE).as_posix()
    return any((file, function.__qualname__) in a.reference_functions for a in ASSIGNMENTS)
