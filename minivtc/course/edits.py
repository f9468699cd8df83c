"""The wrong solutions' language: an edit of one function, made on its syntax tree.

Owns `Wrong` (an assignment, a mistake in a student's words, and the edits that make it from
the reference), `Edit` in its three forms, `replace` (an expression by another), `rewrite` (a
run of statements by others) and `drop` (a statement by `pass`), and `apply` (a file's source
with a wrong solution's edits made). Each edit names its target, (file under minivtc/,
qualified name), in one place, and finds what it changes by a pattern: Python source matched
against the function's `ast`, so formatting, comments and every name the pattern does not spell
make no difference. In a pattern, `_` matches any expression and `_x` matches one and captures
it (the same expression wherever `_x` recurs; the replacement writes it back); a statement `_x`
alone in a block matches the whole block. A pattern must match once in its function, or `apply`
says so (ValueError) rather than grade the reference as a wrong solution. The function is
written back as the mutants are (`mutate.put_function`). The catalogue itself, which quotes
the reference, is `wrong.py`, `wrong_policies.py` and `wrong_mechanisms.py`; this file
quotes nothing.
"""

from __future__ import annotations

import ast
import copy
import textwrap
from dataclasses import dataclass

from minivtc.course.mutate import put_function
from minivtc.course.surgery import find

__all__ = ["Wrong", "apply", "drop", "is_hole", "parse_statements", "replace", "rewrite", "wrong"]

Target = tuple[str, str]  # (file under minivtc/, qualified name)
IGNORED = ("ctx", "kind", "type_comment")  # fields that formatting or context set, not meaning


@dataclass(frozen=True)
class Edit:
    target: Target
    find: str  # the pattern: an expression, or (`statements`) a run of statements
    by: str  # what replaces it, the pattern's captures written back
    statements: bool


@dataclass(frozen=True)
class Wrong:
    key: str  # the assignment
    what: str  # the mistake
    edits: tuple[Edit, ...] = ()
    own_file: str | None = None  # an own-file assignment's file, written whole instead

    @property
    def files(self) -> set[str]:
        return {e.target[0] for e in self.edits}


def wrong(key: str, what: str, *edits: Edit) -> Wrong:
    return Wrong(key, what, edits)


def replace(target: Target, find: str, by: str) -> Edit:
    """In `target`, the one expression matching `find` becomes `by`."""
    return Edit(target, find, by, False)


def rewrite(target: Target, find: str, by: str) -> Edit:
    """In `target`, the one run of statements matching `find` becomes `by`'s statements."""
    return Edit(target, find, by, True)


def drop(target: Target, find: str) -> Edit:
    """In `target`, the one statement matching `find` becomes `pass`."""
    return Edit(target, find, "pass", True)


def apply(edits: tuple[Edit, ...], file: str, source: str) -> str:
    """`source`, the file `file` under minivtc/, with those of `edits` that target it made."""
    for e in edits:
        if e.target[0] == file:
            node = find(ast.parse(source), e.target[1])
            source = put_function(source, node, edited(e, node))
    return source


def edited(e: Edit, node: ast.FunctionDef) -> ast.FunctionDef:
    """A copy of the function `node` with `e` made."""
    function = copy.deepcopy(node)
    hits = (statement_hits if e.statements else expression_hits)(function, e.find)
    if len(hits) != 1:
        raise ValueError(f"{e.target[1]}: {e.find!r} matches {len(hits)} times, not once")
    hit = hits[0]
    if e.statements:
        block, i, captured = hit
        pattern_length = len(parse_statements(e.find))
        block[i : i + pattern_length] = fill_statements(e.by, captured)
    else:
        found, captured = hit
        new = fill(ast.parse(e.by, mode="eval").body, captured)
        ExpressionSwap(found, new).visit(function)
    return function


def expression_hits(function: ast.FunctionDef, find: str) -> list:
    pattern = ast.parse(find, mode="eval").body
    hits = []
    for node in ast.walk(function):
        captured: dict = {}
        if isinstance(node, ast.expr) and matches(node, pattern, captured):
            hits.append((node, captured))
    return hits


def statement_hits(function: ast.FunctionDef, find: str) -> list:
    patterns = parse_statements(find)
    hits = []
    for block in blocks(function):
        for i in range(len(block) - len(patterns) + 1):
            captured: dict = {}
            if all(matches(s, p, captured) for s, p in zip(block[i:], patterns, strict=False)):
                hits.append((block, i, captured))
    return hits


def blocks(function: ast.FunctionDef):
    """Every list of statements in `function`, its own body included."""
    for node in ast.walk(function):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def matches(node, pattern, captured: dict) -> bool:
    """Whether `node` has `pattern`'s shape, each hole binding (or equal to) its capture."""
    if isinstance(pattern, ast.Name) and is_hole(pattern.id):
        return isinstance(node, ast.expr) and bind(pattern.id, node, captured)
    if not isinstance(pattern, ast.AST) or type(node) is not type(pattern):
        return type(node) is type(pattern) and node == pattern
    for field in pattern._fields:
        if field in IGNORED:
            continue
        mine, theirs = getattr(node, field, None), getattr(pattern, field)
        if isinstance(theirs, list):
            if not matches_list(mine, theirs, captured):
                return False
        elif not matches(mine, theirs, captured):
            return False
    return True


def matches_list(nodes, patterns: list, captured: dict) -> bool:
    hole = block_hole(patterns)
    if hole is not None and isinstance(nodes, list) and all(isinstance(n, ast.stmt) for n in nodes):
        return bind(hole, nodes, captured)
    if not isinstance(nodes, list) or len(nodes) != len(patterns):
        return False
    return all(matches(n, p, captured) for n, p in zip(nodes, patterns, strict=True))


def block_hole(patterns: list) -> str | None:
    """The hole's name if `patterns` is one statement `_x` alone: it stands for a whole block."""
    if len(patterns) != 1 or not isinstance(patterns[0], ast.Expr):
        return None
    value = patterns[0].value
    return value.id if isinstance(value, ast.Name) and is_hole(value.id) else None


def is_hole(name: str) -> bool:
    return name == "_" or (name.startswith("_") and name[1:2].isalpha())


def bind(name: str, value, captured: dict) -> bool:
    if name == "_":
        return True
    if name not in captured:
        captured[name] = value
        return True
    return written(captured[name]) == written(value)


def written(value) -> str:
    """What a capture reads as (`ast.dump` would tell `x` assigned from `x` read)."""
    return "\n".join(map(ast.unparse, value)) if isinstance(value, list) else ast.unparse(value)


def parse_statements(text: str) -> list[ast.stmt]:
    return ast.parse(textwrap.dedent(text)).body


def fill(tree: ast.AST, captured: dict):
    """`tree` with each hole replaced by a copy of its capture (a block hole by its block:
    last, so that the block, the reference's own code, is not read for holes)."""
    tree = Holes(captured).visit(tree)
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list):
                setattr(node, name, [s for x in block for s in expand(x, captured)])
    return tree


def fill_statements(text: str, captured: dict) -> list[ast.stmt]:
    module = fill(ast.Module(parse_statements(text), []), captured)
    return module.body


def expand(statement: ast.stmt, captured: dict) -> list[ast.stmt]:
    hole = block_hole([statement])
    if hole is None or not isinstance(captured.get(hole), list):
        return [statement]
    return copy.deepcopy(captured[hole])


class Holes(ast.NodeTransformer):
    """Writes back captured expressions; a hole the pattern did not capture is an error."""

    def __init__(self, captured: dict) -> None:
        self.captured = captured

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if not is_hole(node.id):
            return node
        value = self.captured.get(node.id)
        if isinstance(value, list):
            return node  # a block hole: `fill` puts the block in
        if not isinstance(value, ast.expr):
            raise ValueError(f"the replacement's {node.id} is not captured by the pattern")
        new = copy.deepcopy(value)
        if hasattr(new, "ctx"):
            new.ctx = node.ctx
        return new


class ExpressionSwap(ast.NodeTransformer):
    """Puts `new` where `old` (that very node) is."""

    def __init__(self, old: ast.expr, new: ast.expr) -> None:
        self.old, self.new = old, new

    def visit(self, node: ast.AST) -> ast.AST:
        if node is self.old:
            return ast.copy_location(self.new, node)
        return super().visit(node)
