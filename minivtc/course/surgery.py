"""Source surgery on the package's files, found by qualified name with `ast`: what the edition,
the grader and the grader's own check do to one function of a file.

Owns `stub` (empty one function: its docstring, then `raise NotImplementedError`), `splice`
(put one function of another copy of the file in place of this one's), `take` (the
assignment's functions, and the functions, methods and imports the student added beside them,
into the reference's file; `helpers.py`), and the look-ups they share: `find`, `first_line`,
`is_docstring`. Writes no file (`edition.py` and `grade.py` do).
"""

from __future__ import annotations

import ast

from minivtc.course.helpers import carry, not_taken

__all__ = ["find", "first_line", "is_docstring", "splice", "stub", "take"]


def stub(source: str, qualname: str, message: str) -> str:
    """`source` with the function `qualname`'s body replaced by its docstring (if any) and
    `raise NotImplementedError(message)`."""
    node = find(ast.parse(source), qualname)
    lines = source.splitlines(keepends=True)
    body = node.body
    keep_to = body[0].end_lineno if is_docstring(body[0]) else body[0].lineno - 1
    indent = " " * body[0].col_offset
    raising = f"{indent}raise NotImplementedError({message!r})\n"
    return "".join(lines[:keep_to] + [raising] + lines[node.end_lineno :])


def splice(target: str, donor: str, qualname: str) -> str:
    """`target` with the function `qualname` replaced by `donor`'s (decorators included).
    Raises ValueError if either file does not parse or lacks the function."""
    old, new = find(ast.parse(target), qualname), find(ast.parse(donor), qualname)
    lines, donor_lines = target.splitlines(keepends=True), donor.splitlines(keepends=True)
    start, donor_start = first_line(old), first_line(new)
    return "".join(
        lines[: start - 1] + donor_lines[donor_start - 1 : new.end_lineno] + lines[old.end_lineno :]
    )


def take(target: str, donor: str, names: list[str]) -> tuple[str, list[str]]:
    """`target` (the reference's file) with the functions `names` and the student's own
    helpers taken from `donor` (the student's copy), and what of the student's changes was
    not taken, by name (their changes to the reference's other functions and statements)."""
    source = target
    for qualname in names:
        source = splice(source, donor, qualname)
    return carry(source, donor), not_taken(target, donor, names)


def find(tree: ast.Module, qualname: str) -> ast.FunctionDef:
    scope: list[ast.stmt] = tree.body
    node = None
    for part in qualname.split("."):
        found = [
            n for n in scope if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == part
        ]
        if not found:
            raise ValueError(f"no {qualname} here")
        node = found[0]
        scope = node.body
    if not isinstance(node, ast.FunctionDef):
        raise ValueError(f"{qualname} is not a function")
    return node


def first_line(node: ast.FunctionDef) -> int:
    return min([node.lineno] + [d.lineno for d in node.decorator_list])


def is_docstring(statement: ast.stmt) -> bool:
    value = getattr(statement, "value", None)
    return (
        isinstance(statement, ast.Expr)
        and isinstance(value, ast.Constant)
        and isinstance(value.value, str)
    )
