"""What a lesson prints of the package: a function's source, with the file and line it starts at.

Owns `where` (open the file there), `show` (print the source under that line) and `task`
(print a function's signature and docstring, no more). `show` never prints a function an
assignment asks students to write (`assignments.py`): a lesson points at those (`point_to`,
`where`) or prints what they must do (`task`) instead, so its page gives no answer away.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import minivtc
from minivtc.course.assignments import ASSIGNMENTS
from minivtc.course.surgery import is_docstring

__all__ = ["asked_for", "show", "task", "where"]

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


def task(*functions) -> None:
    """Print each function's signature and docstring under its `where` line: what it must do
    (the edition's stub, as the student sees it), never its body."""
    for function in functions:
        source = textwrap.dedent(inspect.getsource(function))
        node = ast.parse(source).body[0]
        assert isinstance(node, ast.FunctionDef), f"{function.__qualname__} is not a function"
        first = node.body[0]
        end = first.end_lineno if is_docstring(first) else first.lineno - 1
        print(f"# {where(function)}")
        print("".join(source.splitlines(keepends=True)[:end]) + "    ...  # yours to write\n")


def asked_for(function) -> bool:
    """Whether an assignment asks students to write `function` (or the capstone's answer is it)."""
    path = Path(inspect.getsourcefile(function) or "").resolve()
    if not path.is_relative_to(PACKAGE):
        return False
    file = path.relative_to(PACKAGE).as_posix()
    return any((file, function.__qualname__) in a.reference_functions for a in ASSIGNMENTS)
