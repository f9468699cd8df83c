"""The student edition: the package with the assignments' functions left for the student.

Owns `release(out)` (the edition: the package, its bundled model, the lessons without their
solution cells, and a README; every assignment's function kept up to its docstring and then
`raise NotImplementedError`, by `surgery.stub`), what the edition holds in place of an answer
(the placeholder of the capstone's instructor's answer, DRR; each own file's empty class is
`skeletons.py`'s) and the edition's README with each assignment's rubric. Does not own grading
(`grade.py`) or the source surgery it shares with the grader (`surgery.py`).
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import sys
from pathlib import Path

from minivtc.course.assignments import ASSIGNMENTS
from minivtc.course.rubrics import rubric_table
from minivtc.course.skeletons import SKELETONS
from minivtc.course.staff import staff_module
from minivtc.course.surgery import find, is_docstring, stub

__all__ = ["INSTRUCTOR_ONLY", "PACKAGE", "RELEASED", "REPOSITORY", "lesson_needs", "lines_to_write"]
__all__ += ["on_staff_code", "placeholder", "release", "stub", "without_solutions"]

PACKAGE = Path(__file__).resolve().parents[1]  # minivtc/
REPOSITORY = PACKAGE.parent  # where weights/ and lessons/ are, in a checkout
# in the edition, the assignments' files as released (`course test`: `grade.test_edition`)
RELEASED = Path("minivtc") / "course" / "released"
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# not in the edition: wrong*.py quotes the reference's bodies, instructor/ holds the answers
INSTRUCTOR_ONLY = ("__pycache__", "*.pyc", "wrong*.py", "check.py", "instructor")


def release(out: str | Path) -> Path:
    """Write the student edition to `out` (which must not exist yet); return its path."""
    out = Path(out)
    if out.exists():
        raise ValueError(f"{out} exists: the edition goes to a new directory")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(PACKAGE, out / "minivtc", ignore=shutil.ignore_patterns(*INSTRUCTOR_ONLY))
    for folder in ("weights", "lessons"):
        if (REPOSITORY / folder).is_dir():
            shutil.copytree(REPOSITORY / folder, out / folder, ignore=ignore)
    for notebook in sorted((out / "lessons").rglob("*.ipynb")):  # problems/ too
        without_solutions(notebook)
        on_staff_code(notebook)
    stubbed = set()  # a4b extends a3's and a4's functions: each keeps its first assignment's stub
    for a in ASSIGNMENTS:
        for file, qualname in a.functions:
            if (file, qualname) in stubbed:
                continue
            stubbed.add((file, qualname))
            path = out / "minivtc" / file
            message = f"Assignment {a.key}: write {qualname} ({a.title})"
            path.write_text(stub(path.read_text(), qualname, message))
        if a.own_file is not None:
            path = out / "minivtc" / a.own_file
            path.write_text(skeleton(path.read_text(), a.key, SKELETONS[a.own_file]))
        for file in sorted({f for f, _ in a.answer} - set(instructor_only(a))):
            (out / "minivtc" / file).write_text(placeholder(a.key))
    for file in sorted({f for a in ASSIGNMENTS for f, _ in a.functions}):
        kept = out / RELEASED / file
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "minivtc" / file, kept)
    (out / "minivtc" / "course" / "staff_code.py").write_text(staff_code())
    marker = out / "minivtc" / "course" / "__init__.py"
    marker.write_text(
        marker.read_text().replace("STUDENT_EDITION = False", "STUDENT_EDITION = True")
    )
    (out / "README.md").write_text(readme())
    if (REPOSITORY / "pyproject.toml").is_file():  # installable alone: pip install -e 'DIR[dev]'
        (out / "pyproject.toml").write_text(pyproject((REPOSITORY / "pyproject.toml").read_text()))
    return out


def skeleton(source: str, key: str, empty: str) -> str:
    """An own-file assignment's file for the edition: its docstring (the task) and `empty`,
    its class with every method raising NotImplementedError (`skeletons.py`)."""
    tree = ast.parse(source)
    if not tree.body or not is_docstring(tree.body[0]):
        raise ValueError(f"{key}'s file must open with its docstring: the task")
    docstring = "".join(source.splitlines(keepends=True)[: tree.body[0].end_lineno])
    name = re.search(r"^class (\w+)", empty, re.MULTILINE)
    message = f"Assignment {key}: write {name.group(1) if name else 'your policy'}"
    return docstring + empty.replace("MESSAGE", repr(message))


def instructor_only(a) -> list[str]:
    """`a`'s answer files kept in `course/instructor/`, which the edition leaves out whole
    (the design assignments'): no placeholder is written for them."""
    return [f for f, _ in a.answer if f.startswith("course/instructor/")]


def placeholder(key: str) -> str:
    """The edition's copy of a file holding an own-file assignment's answer (DRR): the
    answer is kept outside the edition; its class is there, refusing to be built, so that
    what imports it still imports."""
    return f'''"""Deficit Round Robin (the paper's Appendix C.2) is one answer to the capstone
({key}): it is kept in the instructor's edition. Write your own fair policy in
minivtc/course/capstone.py."""

from __future__ import annotations

from minivtc.fairness.scheduler import Scheduler


class DRR(Scheduler):
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError(
            "DRR is an answer to the capstone ({key}), not in the student edition: write your "
            "own policy in minivtc/course/capstone.py"
        )
'''


def pyproject(text: str) -> str:
    """The repository's pyproject.toml for the edition: the edition has no tests/ folder."""
    lines = [
        'testpaths = ["minivtc/course/graded"]' if line.startswith("testpaths =") else line
        for line in text.splitlines()
    ]
    return "\n".join(lines) + "\n"


def without_solutions(notebook: Path) -> None:
    """Drop the cells tagged "solution": each exercise's self-check then runs on the student's
    answer alone (an untouched `answer = None` fails it). The repository's lessons keep them,
    so that they run top to bottom in CI: they are the instructor's edition."""
    book = json.loads(notebook.read_text())
    book["cells"] = [
        c for c in book["cells"] if "solution" not in c.get("metadata", {}).get("tags", [])
    ]
    notebook.write_text(json.dumps(book, indent=1, ensure_ascii=False) + "\n")


STAFF_CELL = """from minivtc.course import staff

# The assignments' functions run the staff's compiled answers in this notebook (your own
# run in `minivtc course test`): the lesson runs whatever you have written so far.
staff.use()"""


def on_staff_code(notebook: Path) -> None:
    """Open the notebook's code with `staff.use()`: its cells run the staff's compiled answers
    to the assignments (`staff.py`), so it runs in its own week, before they are written."""
    book = json.loads(notebook.read_text())
    first = next(i for i, c in enumerate(book["cells"]) if c["cell_type"] == "code")
    cell: dict[str, object] = {"cell_type": "code", "execution_count": None, "id": "staff-code"}
    cell |= {"metadata": {}, "outputs": [], "source": STAFF_CELL}
    book["cells"].insert(first, cell)
    notebook.write_text(json.dumps(book, indent=1, ensure_ascii=False) + "\n")


def staff_code() -> str:
    """The edition's `minivtc/course/staff_code.py`, for `staff.use()`."""
    functions = [f for a in ASSIGNMENTS for f in a.functions]
    return staff_module(PACKAGE, list(dict.fromkeys(functions)))


def what_to_write(a) -> str:
    if a.own_file is not None:
        name = "FairPolicy" if a.own_file == "course/capstone.py" else "the policy"
        return f"`minivtc/{a.own_file}`: {name}, the whole file"
    return ", ".join(f"`minivtc/{f}`: `{q}`" for f, q in a.functions)


def lesson_needs(lessons: Path) -> dict[str, list[str]]:
    """Each lesson's assignments, as its first cell states them ("**In the student edition**
    this lesson runs in its own week on the staff's compiled answers to a1 and a2 ..."): lesson
    number -> keys (a1, a2, ...): the assignments whose functions the lesson runs."""
    needs = {}
    for path in sorted(lessons.glob("[0-9][0-9]_*.ipynb")):
        first = json.loads(path.read_text())["cells"][0]["source"]
        text = "".join(first) if isinstance(first, list) else first
        _, _, statement = text.partition("**In the student edition**")
        sentence = statement.split(".\n")[0].split(". ")[0]
        needs[path.name[:2]] = sorted(set(re.findall(r"\ba[1-6]b?\b", sentence)))
    return needs


def readme() -> str:
    needs = "; ".join(
        f"{n.lstrip('0') or '0'}: {', '.join(keys) or 'none'}"
        for n, keys in lesson_needs(REPOSITORY / "lessons").items()
    )
    rows = "\n".join(
        f"| {a.key} | {a.title} | {a.teaches} | {a.max_points} | {lines_to_write(a)} | "
        f"{a.hours:g} h | {what_to_write(a)} |"
        for a in ASSIGNMENTS
    )
    rubrics = "\n\n".join(rubric_table(a) for a in ASSIGNMENTS)
    return f"""# minivtc: the student edition

The lessons (`lessons/`) are here without their solutions: each exercise's self-check passes
once your answer is right, and not before.

Each assignment is a handful of functions of the package whose bodies say
`raise NotImplementedError`. Write them (their docstrings, the lessons and the paper say what
they must do), then run one assignment's graded tests on your edition as it stands, from this
directory (the same tests and messages the grader gives):

    minivtc course test a4

Grading itself (`minivtc course grade`) is the instructor's: it runs each assignment's tests in
the reference package, with only your functions for that assignment taken from your edition,
and this edition holds no reference solutions (run here, it says so and stops).

`minivtc course test a4` takes only a4's functions from your edition, as grading does: every
other assignment's functions run the staff's compiled answers (below), with the assignments'
files as released, so it scores what grading would, whatever you have written elsewhere (a4's
bench runs a3's `admission_round`; a3's tests run a1's model, a2's allocator and a4's VTC).

Each lesson and problem set runs in its own week, whatever you have written so far: its first
code cell, `staff.use()`, puts the staff's compiled answers to the assignments into the
package's functions for that notebook's run (`minivtc/course/staff.py`). They are the reference
functions' code objects, marshalled (`minivtc/course/staff_code.py`), not their source; marshal's
format belongs to one Python minor version, and this edition's is Python {PYTHON}: on another,
`staff.use()` stops and says so (ask for an edition built with yours). A determined student can
disassemble them (`dis`), as with any staff binary: the lessons are the reference to read, not
these. `minivtc course test` and grading run your own functions for the assignment they
test (grading runs the reference for the others, `course test` the staff's code); to watch
yours in a lesson, leave `staff.use()` out. The assignments each lesson
runs, as its first cell says: {needs}. None needs a6. Readable copies, executed, with the
solutions and their checks' outputs left out: `minivtc course render PAGES` (the instructor runs
it with the reference package).

The capstone, a6, is yours: `minivtc/course/capstone.py` says what a fair policy must do and
how it is graded; write `FairPolicy` and state its bound (`gap_bound` and `BOUND`).

The design assignments, d1 and d2, are yours too, in settings this package does not cover:
`minivtc/course/design/quota.py` (per-client quotas) and `minivtc/course/design/tenants.py`
(tenants of several users) each state the task; write the policy and its bound. `minivtc
course test d1` runs them on public example workloads (`design_bench.PUBLIC_SEEDS`); grading
runs the same properties on workloads drawn from a seed this edition does not hold.

Install this edition, and only this edition: `pip install -e '.[dev]'` from this directory
(in a fresh virtual environment). Do not install the repository's own package: it holds the
reference answers, and where both are installed you cannot tell which one your lessons and
tests import.

An assignment is graded on its own: its tests run on the reference package with just your
functions for it, so an unfinished assignment never costs points in another.

Your helpers are yours: besides the functions named below, every function, method, class,
constant and import you *add* in an assignment's files is graded with them. The rest of those
files is the reference's: a change you make to one of its other functions, methods or
constants is not taken, and the grader names each such change in the assignment's note.
For each failed test the grader prints what it checks and its first assertion message (also
in `grades.json`); `--verbose` prints the tests' full output.

"lessons, graded by" names every lesson whose mechanisms the assignment grades. "lines" is
measured: the lines of code of the reference's answer (the functions' bodies, without
docstrings, comments, blank lines and asserts; for a6, the instructor's DRR). "hours" is
estimated from measured counts: the course was taken once on this edition (by an AI coding
agent that read only the edition), and for each assignment the words read in its files and the
lines written were counted; the hours are those words at 200 a minute plus those lines at 4
minutes each (working out what to write, writing it, fixing it), rounded up to a quarter hour;
for functions asked for since, their reference's lines are added. The rates are stated, not
measured: lessons/SYLLABUS.md ("How these hours were found") gives
the counts, to redo the arithmetic at your own pace.

| assignment | what you write | lessons, graded by | points | lines | hours | functions |
| --- | --- | --- | --- | --- | --- | --- |
{rows}

## The rubric

Each assignment is graded by mechanism: every graded test belongs to one line below, and a
line's points are lost when any of its tests fails (a mechanism is understood, or it is not).
The grader's table and `grades.json` show each line with its points.

{rubrics}
"""


def lines_to_write(a) -> int:
    """The lines of code of the reference's answer to `a`: its functions' (or its answer's)
    bodies, without docstrings, comments, blank lines and asserts."""
    total = 0
    for file, qualname in a.functions or a.answer:
        node = find(ast.parse((PACKAGE / file).read_text()), qualname)
        body = node.body[1:] if is_docstring(node.body[0]) else node.body
        text = "\n".join(ast.unparse(n) for n in body if not isinstance(n, ast.Assert))
        total += sum(1 for line in text.splitlines() if line.strip())
    return total
