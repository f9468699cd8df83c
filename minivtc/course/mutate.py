"""Mutants of the reference solutions: the measure of how much wrong the graded tests see.

Owns `mutants(assignment)`: the reference file of each of the assignment's functions with one
small change made over `ast` (our own, not a mutation tool: the changes must stay inside the
named functions, whose bodies a student writes, and run through the real grader, which
splices functions; a tool such as mutmut mutates whole files and runs its own test command).
The changes: an arithmetic operator swapped (+ -, * /, // /, % //, ** *), a comparison
turned (< <=, > >=, == !=, is / is not, in / not in), min and max exchanged, and / or
exchanged, a `not` or a unary minus dropped, a number raised by one (a float doubled, 0.0 to
1.0), True and False exchanged, a statement replaced by `pass`. Not mutated: docstrings and
`assert` statements, messages included (a caller's contract checked defensively: a correct
caller never trips it, so no test of the function's behaviour can see it go or change), and a
function's final `return None` (dropped, the function returns None all the same: a mutant
equivalent by construction). At most `limit` mutants per assignment, chosen evenly over every
site and reproducibly.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

from minivtc.course.assignments import Assignment
from minivtc.course.edition import PACKAGE
from minivtc.course.surgery import find, first_line, is_docstring

__all__ = ["Mutant", "mutants", "put_function"]

SWAPS: dict[type, type] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.And: ast.Or,
    ast.Or: ast.And,
}


@dataclass(frozen=True)
class Mutant:
    file: str  # under minivtc/
    qualname: str
    change: str  # e.g. "line 79: < to <="
    source: str  # the whole file, mutated


class Mutator(ast.NodeTransformer):
    """Counts the mutation sites; makes the change at site `target` (-1: none)."""

    def __init__(self, target: int = -1) -> None:
        self.target, self.count, self.change = target, 0, ""

    def site(self, node: ast.AST, what: str) -> bool:
        hit = self.count == self.target
        self.count += 1
        if hit:
            self.change = f"line {getattr(node, 'lineno', '?')}: {what}"
        return hit

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and not isinstance(node, ast.Module):
                for i, statement in enumerate(block):
                    last = isinstance(node, ast.FunctionDef) and i == len(block) - 1
                    droppable = not (
                        isinstance(statement, ast.Assert)
                        or is_docstring(statement)
                        or (last and returns_none(statement))  # what falling off the end does
                    )
                    if droppable and self.site(
                        statement, f"drop `{ast.unparse(statement).splitlines()[0]}`"
                    ):
                        block[i] = ast.copy_location(ast.Pass(), statement)
        return super().generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        return node  # neither dropped nor changed inside (its message included)

    def visit_op(self, node: ast.AST, op: ast.AST, set_op) -> None:
        swap = SWAPS.get(type(op))
        if swap is not None and self.site(node, f"{type(op).__name__} to {swap.__name__}"):
            set_op(swap())

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.visit_op(node, node.op, lambda op: setattr(node, "op", op))
        return self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AST:
        self.visit_op(node, node.op, lambda op: setattr(node, "op", op))
        return self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        self.visit_op(node, node.op, lambda op: setattr(node, "op", op))
        return self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        for i, op in enumerate(node.ops):
            self.visit_op(node, op, lambda new, i=i: node.ops.__setitem__(i, new))
        return self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        if isinstance(node.op, (ast.Not, ast.USub)) and self.site(node, "drop a unary operator"):
            return self.visit(node.operand)
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        other = {"min": "max", "max": "min"}.get(node.id)
        if other and isinstance(node.ctx, ast.Load) and self.site(node, f"{node.id} to {other}"):
            return ast.copy_location(ast.Name(other, ast.Load()), node)
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        value = node.value
        if isinstance(value, bool):
            new: bool | int | float = not value
        elif isinstance(value, int):
            new = value + 1
        elif isinstance(value, float):
            new = value * 2 if value else 1.0
        else:
            return node
        if self.site(node, f"{value!r} to {new!r}"):
            return ast.copy_location(ast.Constant(new), node)
        return node


def returns_none(statement: ast.stmt) -> bool:
    """`return` or `return None`: dropped as a function's last statement, it changes nothing."""
    if not isinstance(statement, ast.Return):
        return False
    return statement.value is None or (
        isinstance(statement.value, ast.Constant) and statement.value.value is None
    )


def mutants(assignment: Assignment, limit: int = 40) -> list[Mutant]:
    """Up to `limit` mutants of `assignment`'s reference functions, spread evenly over all."""
    found = []
    for file, qualname in assignment.reference_functions:
        source = (PACKAGE / file).read_text()
        node = find(ast.parse(source), qualname)
        sites = Mutator()
        sites.visit(copy.deepcopy(node))
        found += [(file, qualname, source, node, i) for i in range(sites.count)]
    step = max(1.0, len(found) / limit)
    chosen = [found[int(i * step)] for i in range(min(limit, len(found)))]
    return [mutate(*site) for site in chosen]


def mutate(file: str, qualname: str, source: str, node: ast.FunctionDef, site: int) -> Mutant:
    mutator = Mutator(site)
    changed = mutator.visit(copy.deepcopy(node))
    return Mutant(file, qualname, mutator.change, put_function(source, node, changed))


def put_function(source: str, node: ast.FunctionDef, changed: ast.FunctionDef) -> str:
    """`source` with the function at `node` written as `changed` (unparsed: its comments go,
    which no test can see). The wrong solutions' edits (`edits.py`) are written back so too."""
    indent = " " * node.col_offset
    text = "".join(indent + line + "\n" for line in ast.unparse(changed).splitlines())
    lines = source.splitlines(keepends=True)
    start, end = first_line(node) - 1, node.end_lineno or 0
    return "".join(lines[:start]) + text + "".join(lines[end:])
