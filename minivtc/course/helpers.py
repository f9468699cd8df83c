"""The student's helpers: what of their file, beyond the assignment's functions, is graded.

The rule (stated in the edition's README): an assignment's named functions are graded, with
every function, method, class, constant (a module's or a class's new name) and import the
student *adds* in those files; the reference's other code is kept as it is, so a change to one
of its functions, methods or constants is not taken, and the grader names each such change in
its note (never a silent 0). Owns `carry` (add the donor's new definitions, constants and
imports to the target) and `not_taken` (name what is left out).
"""

from __future__ import annotations

import ast

__all__ = ["carry", "not_taken"]

DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
IMPORTS = (ast.Import, ast.ImportFrom)
ASSIGNMENTS = (ast.Assign, ast.AnnAssign)


def carry(target: str, donor: str) -> str:
    """`target` with `donor`'s new imports and constants (after the target's last import), its
    new top-level functions and classes (at the end) and its classes' new methods and
    attributes (at the end of the class)."""
    lines, donor_lines = target.splitlines(keepends=True), donor.splitlines(keepends=True)
    tree, theirs = ast.parse(target), ast.parse(donor)
    ours = {n.name: n for n in tree.body if isinstance(n, DEFINITIONS)}
    inserts: list[tuple[int, list[str]]] = []  # (after line, lines)
    appended: list[str] = []  # new top-level definitions, after everything
    for node in theirs.body:
        if isinstance(node, DEFINITIONS) and node.name not in ours:
            appended += ["\n", "\n", *segment(donor_lines, node)]
        elif isinstance(node, ast.ClassDef) and isinstance(ours.get(node.name), ast.ClassDef):
            mine = ours[node.name]
            have = {n.name for n in mine.body if isinstance(n, DEFINITIONS)} | names_in(mine.body)
            for member in node.body:
                if is_new(member, have):
                    inserts.append((mine.end_lineno or 0, ["\n", *segment(donor_lines, member)]))
    known = {ast.dump(n) for n in tree.body if isinstance(n, IMPORTS)}
    last_import = max((n.end_lineno or 0 for n in tree.body if isinstance(n, IMPORTS)), default=0)
    have = set(ours) | names_in(tree.body)
    for node in theirs.body:
        if isinstance(node, IMPORTS) and ast.dump(node) not in known:
            inserts.append((last_import, segment(donor_lines, node)))
        elif isinstance(node, ASSIGNMENTS) and is_new(node, have):  # a constant of theirs
            inserts.append((last_import, ["\n", *segment(donor_lines, node)]))
    for after, new in sorted(inserts, key=lambda x: x[0], reverse=True):
        if new and not new[-1].endswith("\n"):
            new[-1] += "\n"
        lines[after:after] = new
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return "".join(lines + appended)


def not_taken(target: str, donor: str, names: list[str]) -> list[str]:
    """The student's changes that are not graded: each of the reference's functions (other
    than `names`) and constants that `donor` changed or removed."""
    target_tree, donor_tree = ast.parse(target), ast.parse(donor)
    ours, theirs = definitions(target_tree), definitions(donor_tree)
    reference = constants(target_tree)
    left = [
        f"your change to {name} was not taken (the reference's value is used)"
        for name, dump in constants(donor_tree).items()
        if reference.get(name, dump) != dump
    ]
    for qualname, dump in ours.items():
        if qualname in names or any(qualname.startswith(n + ".") for n in names):
            continue
        if qualname not in theirs:
            left.append(f"you removed {qualname}; the reference's is used")
        elif theirs[qualname] != dump:
            left.append(f"your changes to {qualname} were not taken (only new helpers are)")
    return left


def definitions(tree: ast.Module) -> dict[str, str]:
    """Every function and method by qualified name, mapped to its `ast.dump` (comments and
    layout do not count)."""
    found: dict[str, str] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[prefix + node.name] = ast.dump(node)

    visit(tree.body, "")
    return found


def names_in(body: list[ast.stmt]) -> set[str]:
    """The names the assignments of `body` bind (a module's or a class's constants)."""
    return {name for node in body if isinstance(node, ASSIGNMENTS) for name in bound(node)}


def bound(node: ast.Assign | ast.AnnAssign) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def is_new(node: ast.stmt, have: set[str]) -> bool:
    """A definition, or an assignment, that binds no name `have` holds: the student's own."""
    if isinstance(node, DEFINITIONS):
        return node.name not in have
    return isinstance(node, ASSIGNMENTS) and not set(bound(node)) & have


def constants(tree: ast.Module) -> dict[str, str]:
    """Each module-level and class-level name an assignment binds, by qualified name, mapped to
    its assignment's `ast.dump`."""
    found: dict[str, str] = {}
    for node in tree.body:
        scope = node.body if isinstance(node, ast.ClassDef) else [node]
        prefix = f"{node.name}." if isinstance(node, ast.ClassDef) else ""
        for member in scope:
            if isinstance(member, ASSIGNMENTS):
                found.update({prefix + name: ast.dump(member) for name in bound(member)})
    return found


def segment(lines: list[str], node: ast.stmt) -> list[str]:
    """The lines of `node`, its decorators included."""
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return lines[start - 1 : node.end_lineno]
