"""The wrong solutions' edits (course/edits.py): made on the syntax tree, so the catalogue
(course/wrong.py, course/wrong_policies.py) survives a reformat of the reference and a rename of
whatever its patterns do not spell, and each entry makes the same functions either way. Whether
each entry loses points is tests/test_course_grader.py's."""

from __future__ import annotations

import ast
from collections.abc import Callable

import pytest

from minivtc.course.edition import PACKAGE
from minivtc.course.edits import Wrong, apply, drop, is_hole, parse_statements, replace, rewrite
from minivtc.course.surgery import find
from minivtc.course.wrong import WRONG

EDITED = [w for w in WRONG if w.edits]  # the others write the capstone's file whole
F = ("f.py", "f")
SOURCE = """
def f(a, b):
    x = a + b  # a comment
    while x < 10:
        x = x * 2
    return x + a
"""


def reference(file: str) -> str:
    return (PACKAGE / file).read_text()


def edited_functions(wrong: Wrong, read: Callable[[str], str]) -> dict[str, str]:
    """Each function `wrong` edits, as it reads once edited, the files read by `read`."""
    functions = {}
    for file in sorted(wrong.files):
        source = apply(wrong.edits, file, read(file))
        for e in wrong.edits:
            if e.target[0] == file:
                functions[e.target[1]] = ast.unparse(find(ast.parse(source), e.target[1]))
    return functions


class Rename(ast.NodeTransformer):
    """Every name, attribute, parameter and keyword not in `kept` gets a prefix."""

    def __init__(self, kept: set[str]) -> None:
        self.kept = kept

    def new(self, name: str) -> str:
        return name if name in self.kept else f"renamed_{name}"

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self.new(node.id)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        node.attr = self.new(node.attr)
        return self.generic_visit(node)

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self.new(node.arg)
        return self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> ast.AST:
        node.arg = node.arg and self.new(node.arg)
        return self.generic_visit(node)


def spelled(wrong: Wrong) -> set[str]:
    """The names `wrong`'s patterns and replacements write out (its holes are not names)."""
    names = set()
    for e in wrong.edits:
        for text in (e.find, e.by):
            for node in ast.walk(ast.Module(parse_statements(text), [])):
                name = getattr(node, "id", None) or getattr(node, "attr", None)
                name = name or (node.arg if isinstance(node, (ast.arg, ast.keyword)) else None)
                if name and not is_hole(name):
                    names.add(name)
    return names


def renamed(source: str, functions: set[str], kept: set[str]) -> str:
    """`source` with the functions `functions` renamed inside (`Rename`), the rest as it is."""
    tree = ast.parse(source)
    for qualname in functions:
        Rename(kept).visit(find(tree, qualname))
    return ast.unparse(tree)


def test_every_wrong_solution_applies_once_and_changes_each_function_it_targets():
    for wrong in EDITED:
        for qualname, text in edited_functions(wrong, reference).items():
            (file,) = {e.target[0] for e in wrong.edits if e.target[1] == qualname}
            before = ast.unparse(find(ast.parse(reference(file)), qualname))
            assert text != before, (wrong.what, qualname)


def test_a_reformatted_reference_gives_every_wrong_solution_the_same_functions():
    """ast.unparse reformats: other quotes, other line breaks, no comments, no parentheses
    that only group lines; every entry still applies and makes the same functions."""
    for wrong in EDITED:
        reformatted = edited_functions(wrong, lambda f: ast.unparse(ast.parse(reference(f))))
        assert reformatted == edited_functions(wrong, reference), wrong.what


def test_renaming_what_a_wrong_solution_does_not_spell_leaves_it_the_same_functions():
    """Every local, parameter, attribute and helper in the targeted functions renamed, except
    the names the entry's patterns and replacements write out: each entry still applies, and
    makes the functions it made, renamed alike."""
    for wrong in EDITED:
        kept, targets = spelled(wrong), {e.target[1] for e in wrong.edits}
        on_renamed = edited_functions(
            wrong, lambda f, t=targets, k=kept: renamed(reference(f), t, k)
        )
        expected = edited_functions(wrong, reference)
        for qualname, text in expected.items():
            tree = ast.parse(text)
            Rename(kept).visit(tree.body[0])
            assert on_renamed[qualname] == ast.unparse(tree), (wrong.what, qualname)


def test_the_policy_entries_apply_when_the_books_move_to_another_object():
    """`self.charge(...)` written `self.ledger.charge(...)` (the books moved out of the
    policy): the entries that edit a charge leave the receiver open and still apply."""

    class Move(ast.NodeTransformer):
        def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
            self.generic_visit(node)
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                if node.attr in ("charge", "charged"):
                    node.value = ast.Attribute(node.value, "ledger", ast.Load())
            return node

    moved = ast.unparse(Move().visit(ast.parse(reference("fairness/vtc.py"))))
    for wrong in [w for w in EDITED if w.files == {"fairness/vtc.py"}]:  # a4's and a4b's
        assert apply(wrong.edits, "fairness/vtc.py", moved) != moved, wrong.what


def test_a_pattern_matches_on_the_tree_with_its_holes():
    made = apply((replace(F, "_p * 2", "_p * 3"),), "f.py", SOURCE)
    assert "x = x * 3" in made and "# a comment" not in made  # unparsed, as the mutants are
    made = apply((rewrite(F, "while _c:\n    _body", "if _c:\n    _body"),), "f.py", SOURCE)
    assert "if x < 10:\n        x = x * 2" in made
    made = apply((drop(F, "_x = _ + _"),), "f.py", SOURCE)
    assert "    pass\n    while" in made
    twice = (rewrite(F, "return _x + _y", "return _y + _x"), replace(F, "_p * 2", "2"))
    made = apply(twice, "f.py", SOURCE)
    assert ast.unparse(find(ast.parse(made), "f")).endswith("x = 2\n    return a + x")


@pytest.mark.parametrize(
    "edit",
    [
        replace(F, "_p + _q", "_q"),  # twice: a + b and x + a
        replace(F, "_p + _p", "_p"),  # a hole recurs only on the same expression: never here
        replace(F, "_p * 2", "_q"),  # _q captured by nothing
        drop(("f.py", "g"), "_x = _"),  # no such function
    ],
)
def test_an_edit_that_does_not_match_once_is_refused(edit):
    with pytest.raises(ValueError):
        apply((edit,), "f.py", SOURCE)


def test_every_name_a_replacement_writes_is_defined_where_it_lands():
    """A replacement's names (`weights_of`, `h`, `n`...) are the function's, its module's or
    builtins: a wrong solution that lost an import would lose points to a NameError, for no
    mistake of its own."""
    import builtins

    for wrong in EDITED:
        for e in wrong.edits:
            tree = ast.parse(reference(e.target[0]))
            known = set(dir(builtins)) | module_names(tree)
            for node in ast.walk(find(tree, e.target[1])):
                if isinstance(node, ast.arg) or isinstance(getattr(node, "ctx", None), ast.Store):
                    known.add(getattr(node, "arg", None) or getattr(node, "id", ""))
            for node in ast.walk(ast.Module(parse_statements(e.by), [])):
                if isinstance(node, ast.Name) and not is_hole(node.id):
                    assert node.id in known or is_bound_in(node.id, e.by), (wrong.what, node.id)


def module_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    return names


def is_bound_in(name: str, text: str) -> bool:
    """Whether `text` itself binds `name` (an assignment, a loop, a lambda's parameter)."""
    for node in ast.walk(ast.Module(parse_statements(text), [])):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == name:
            return True
        if isinstance(node, ast.arg) and node.arg == name:
            return True
    return False
