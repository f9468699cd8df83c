"""The student edition hands over no answer: no lesson's visible code is an assignment's answer,
and no docstring it keeps states a problem set's answer.

A lesson's code cells (but the solutions, which the edition drops) that define a function an
assignment asks for (by its name: a module's function, or the method of the asked class or of a
class built on it) are pasted into the edition as the student's answer, the assignment's other
functions left as the edition's stubs, and graded: none may gain a point. A planted cell holding
the reference's own `table_metrics` shows the same path finds and scores a real answer. Under
another name an answer escapes that check, so no lesson's loop may make the calls an answer's
loop makes, in its order, whatever the function holding it is called (Lesson 5's `one_round`
once made `admission_round`'s: peek, dispatch before the next peek; a3's answer renamed, its
room counted where the answer asks `place`). The docstrings of every file the edition keeps
are searched for the problem sets' answers, by their key numbers and phrases (`ANSWERS`)."""

from __future__ import annotations

import ast
import fnmatch
import json
import re
from collections import deque
from pathlib import Path

import pytest

from minivtc.course.assignments import ASSIGNMENTS, Assignment
from minivtc.course.edition import INSTRUCTOR_ONLY, PACKAGE, REPOSITORY
from minivtc.course.grade import How, grade_one
from minivtc.course.surgery import find, splice, stub

LESSONS = REPOSITORY / "lessons"

# (problem, what its worked answer says), written as a docstring would put it
ANSWERS = [
    ("problem set 1, 1(d)", "12,048"),
    ("problem set 2, 7(a)", "1,072"),
    ("problem set 2, 7(b)", "5,048"),
    ("problem set 2, 7(d)", "19,951"),
    ("problem set 1, 2", "the last time before t it was dispatched"),
    ("problem set 1, 2", "to which the same argument applies"),
    ("problem set 1, 4(a)", "m // j - 1"),
    ("problem set 1, 4(b)", "m ln(m)"),
    ("problem set 2, 5(a)", "40,512"),
    ("problem set 2, 5(a)", "40,001"),
    ("problem set 2, 5(c)", "[-w_q m, q]"),
    ("problem set 2, 6(a)", "ceil(tau / delta)"),
    ("problem set 2, 6(a)", "165,120"),
    ("problem set 2, 6(a)", "times the steps a replica makes"),
    ("problem set 2, 6(b)", "differs from what its counter says by the output not yet seen"),
    ("problem set 2, 6(b)", "may be off by w_q g"),
]
# Sentences the edition once kept (fleet/dispatcher.py: `News`, `Dispatcher`): the search finds them
ONCE_KEPT = [
    "What a client has received differs from what its counter says by the output not yet seen:"
    " between 0 and w_q G",
    "G is at most the client's running requests times the steps a replica makes in tau seconds",
    "Take a waiting client i at time t and t0 the last time before t it was dispatched or joined Q",
]


def normal(text: str) -> str:
    """Lower case, one space between words, the typeset minus and dot as plain text."""
    text = text.replace("\u2212", "-").replace("\u00b7", " ").replace("\u00d7", "x")
    return re.sub(r"\s+", " ", text).lower()


def answers_in(text: str) -> list[str]:
    found = normal(text)
    return [f"{problem}: {phrase!r}" for problem, phrase in ANSWERS if phrase in found]


def kept_files() -> list[Path]:
    """The package's files the student edition keeps as they are (no instructor-only file, no
    placeholder of an answer)."""
    answers = {f for a in ASSIGNMENTS for f, _ in a.answer}
    return [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if not any(
            fnmatch.fnmatch(part, pattern) for part in p.parts for pattern in INSTRUCTOR_ONLY
        )
        and p.relative_to(PACKAGE).as_posix() not in answers
    ]


def docstrings(source: str) -> list[str]:
    tree = ast.parse(source)
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return [
        doc
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        if (doc := ast.get_docstring(node))
    ]


def test_no_docstring_the_edition_keeps_states_a_problem_set_answer():
    found = {
        p.relative_to(PACKAGE).as_posix(): hits
        for p in kept_files()
        if (hits := [h for doc in docstrings(p.read_text()) for h in answers_in(doc)])
    }
    assert not found, f"docstrings that state a problem set's answer: {found}"


def test_the_search_finds_the_answers_the_edition_once_kept():
    for sentence in ONCE_KEPT:
        assert answers_in(sentence), sentence


def visible_cells(notebook: Path) -> list[tuple[int, ast.Module]]:
    """The code cells the student edition keeps, parsed (IPython's magics left out)."""
    cells = []
    for i, cell in enumerate(json.loads(notebook.read_text())["cells"]):
        if cell["cell_type"] != "code" or "solution" in cell["metadata"].get("tags", []):
            continue
        lines = "".join(cell["source"]).splitlines()
        code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in lines)
        cells.append((i, ast.parse(code)))
    return cells


def asked_by(tree: ast.Module) -> list[tuple[Assignment, str, str]]:
    """(assignment, qualified name, the definition as the answer's file would hold it) for
    each function of `tree` that an assignment asks for."""
    found = []
    for a in ASSIGNMENTS:
        for _, qualname in a.functions:
            owner, _, name = qualname.rpartition(".")
            for node in tree.body:
                if not owner and isinstance(node, ast.FunctionDef) and node.name == name:
                    found.append((a, qualname, ast.unparse(node)))
                if owner and isinstance(node, ast.ClassDef) and built_on(node, owner):
                    methods = [m for m in node.body if isinstance(m, ast.FunctionDef)]
                    for m in methods:
                        if m.name == name:
                            cls = ast.ClassDef(owner, [], [], [m], [], type_params=[])
                            found.append((a, qualname, ast.unparse(ast.fix_missing_locations(cls))))
    return found


def built_on(node: ast.ClassDef, owner: str) -> bool:
    bases = {ast.unparse(b).rpartition(".")[2] for b in node.bases}
    return node.name == owner or owner in bases


def lesson_answers() -> list[tuple[str, Assignment, str, str]]:
    return [
        (f"{notebook.relative_to(LESSONS)} cell {i}", a, qualname, code)
        for notebook in sorted(LESSONS.rglob("*.ipynb"))
        for i, tree in visible_cells(notebook)
        for a, qualname, code in asked_by(tree)
    ]


def pasted(a: Assignment, qualname: str, code: str, out: Path) -> Path:
    """The student edition's files of `a` (every function a stub) with `code` as the answer
    for `qualname`."""
    for file in sorted({f for f, _ in a.functions}):
        source = (PACKAGE / file).read_text()
        for _, name in (fq for fq in a.functions if fq[0] == file):
            source = stub(source, name, f"Assignment {a.key}: write {name} ({a.title})")
        if (file, qualname) in a.functions:
            source = splice(source, code, qualname)
        (out / "minivtc" / file).parent.mkdir(parents=True, exist_ok=True)
        (out / "minivtc" / file).write_text(source)
    return out


def points(a: Assignment, qualname: str, code: str, tmp: Path) -> float:
    return grade_one(a, pasted(a, qualname, code, tmp), How(180)).points


@pytest.mark.slow
def test_a_lesson_s_code_pasted_as_an_answer_gains_no_point(tmp_path):
    for i, (where, a, qualname, code) in enumerate(lesson_answers()):
        got = points(a, qualname, code, tmp_path / str(i))
        assert got == 0, f"{where}, pasted as {a.key}'s {qualname}, gains {got} points"


@pytest.mark.slow
def test_the_reference_answer_pasted_from_a_cell_is_found_and_scores(tmp_path):
    reference = ast.unparse(
        find(ast.parse((PACKAGE / "sim/metrics.py").read_text()), "table_metrics")
    )
    (found,) = asked_by(ast.parse(reference))
    a, qualname, code = found
    assert (a.key, qualname) == ("a5_metric", "table_metrics")
    assert points(a, qualname, code, tmp_path) == a.max_points


# Methods every list, dict, set and deque has: a loop's bookkeeping, not a mechanism's calls
CONTAINER_METHODS = frozenset(name for kind in (list, dict, set, deque) for name in dir(kind))

# Lesson 5's round as it once was: peek, dispatch, before the next peek (a3's answer, renamed)
OLD_ROUND = """
def one_round(policy, room, charge_at_dispatch=True):
    admitted = []
    while (request := policy.peek()) is not None and len(admitted) < room:
        policy.dispatch(request)
        admitted.append(request)
    return "".join(r.client_id for r in admitted)
"""


def loop_calls(tree: ast.AST) -> list[list[str]]:
    """For each loop in `tree` (a `for` or `while`, its test included), the methods it calls on
    a named object (`policy.peek()`, `heapq.heappop()`), in the order they are written, less
    the containers' own."""
    found = []
    for loop in ast.walk(tree):
        if isinstance(loop, (ast.For, ast.While)):
            calls = sorted(
                (n.lineno, n.col_offset, n.func.attr)
                for n in ast.walk(loop)
                if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute)
                and n.func.attr not in CONTAINER_METHODS
                and named(n.func.value)
            )
            found.append([name for *_, name in calls])
    return found


def named(node: ast.expr) -> bool:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return isinstance(node, ast.Name)


def answer_loops() -> list[tuple[str, list[str]]]:
    """(assignment: function, the calls of one of its loops) for each loop of a reference
    answer that calls two methods or more: a round, a pick, a displacement."""
    return [
        (f"{a.key}: {qualname}", calls)
        for a in ASSIGNMENTS
        for file, qualname in a.reference_functions
        for calls in loop_calls(find(ast.parse((PACKAGE / file).read_text()), qualname))
        if len(set(calls)) >= 2
    ]


def copies(tree: ast.AST, answers: list[tuple[str, list[str]]]) -> list[str]:
    """The answers one of `tree`'s loops makes the calls of, in their order (among others)."""
    return [
        f"{name} ({', '.join(calls)})"
        for made in loop_calls(tree)
        for name, calls in answers
        if in_order(calls, made)
    ]


def in_order(calls: list[str], made: list[str]) -> bool:
    rest = iter(made)
    return all(call in rest for call in calls)


def test_no_lesson_loop_makes_an_answer_s_loop_calls_in_its_order():
    answers = answer_loops()
    found = [
        f"{notebook.relative_to(LESSONS)} cell {i}: {copy}"
        for notebook in sorted(LESSONS.rglob("*.ipynb"))
        for i, tree in visible_cells(notebook)
        for copy in copies(tree, answers)
    ]
    assert not found, f"lesson loops that are an answer's loop renamed: {found}"


def test_the_loop_search_finds_lesson_5_s_old_round_and_what_it_looks_for():
    answers = dict(answer_loops())
    assert answers["a3_batching: admission_round"] == ["peek", "dispatch"]
    assert answers["a3_batching: Engine.make_room"] == ["reserve", "displace", "preempt"]
    assert copies(ast.parse(OLD_ROUND), answer_loops()) == [
        "a3_batching: admission_round (peek, dispatch)"
    ]
