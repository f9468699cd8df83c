"""Coursework: the student edition, the source surgery behind it, and the grader.

Both directions the course relies on: the reference scores full marks, and a fresh student
edition scores 0 on every assignment (the graded tests can fail). A submission that does not
parse or hangs scores 0 for that assignment alone."""

from __future__ import annotations

import json
import textwrap

import pytest

from minivtc.course.assignments import ASSIGNMENTS
from minivtc.course.edition import release, splice, stub, take
from minivtc.course.grade import grade

SOURCE = textwrap.dedent('''
    class A:
        @staticmethod
        def f(x):
            """Doubles x."""
            y = x * 2
            return y

    def g():
        return 1
''')


def test_stub_keeps_the_signature_and_docstring_and_nothing_else():
    out = stub(SOURCE, "A.f", "write A.f")
    assert '"""Doubles x."""' in out and "raise NotImplementedError('write A.f')" in out
    assert "x * 2" not in out and "def g():\n    return 1" in out
    namespace: dict = {}
    exec(out, namespace)
    with pytest.raises(NotImplementedError, match="write A.f"):
        namespace["A"].f(3)


def test_splice_takes_one_function_from_the_donor():
    donor = SOURCE.replace("x * 2", "x * 3").replace("return 1", "return 99")
    out = splice(SOURCE, donor, "A.f")
    namespace: dict = {}
    exec(out, namespace)
    assert namespace["A"].f(2) == 6 and namespace["g"]() == 1  # g stays the target's
    with pytest.raises(ValueError, match="no A.h"):
        splice(SOURCE, donor, "A.h")


def test_every_assignment_names_functions_that_exist():
    import ast

    from minivtc.course.edition import PACKAGE, find

    for a in ASSIGNMENTS:
        for file, qualname in a.reference_functions:
            find(ast.parse((PACKAGE / file).read_text()), qualname)
        assert a.functions or a.own_file, a.key


@pytest.mark.slow
def test_the_reference_gets_full_marks_and_a_fresh_edition_none(tmp_path):
    reference = grade(None, tmp_path / "reference")
    assert reference["total"] == reference["max_total"] == 130, reference
    edition = release(tmp_path / "edition")
    fresh = grade(edition, edition)
    assert fresh["total"] == 0 and all(g["tests"] > 0 for g in fresh["assignments"]), fresh
    saved = json.loads((edition / "grades.json").read_text())
    assert saved == fresh and set(saved) == {"assignments", "total", "max_total"}
    assert {"name", "points", "max_points"} <= set(saved["assignments"][0])


@pytest.mark.slow
def test_each_assignment_is_graded_alone_and_a_bad_one_never_breaks_the_grader(tmp_path):
    """A student who solved a4 (the reference's functions), whose a2 file does not parse and
    whose a3 step hangs: a4 full marks, a2 and a3 zero with a reason, the grader goes on."""
    from minivtc.course.edition import PACKAGE

    edition = release(tmp_path / "edition")
    mine = edition / "minivtc"
    (mine / "core/vtc.py").write_text((PACKAGE / "core/vtc.py").read_text())
    kv = mine / "core/kv_pool.py"
    kv.write_text(kv.read_text() + "\ndef broken(:\n")
    engine = mine / "core/engine.py"
    engine.write_text(
        engine.read_text().replace(
            "raise NotImplementedError('Assignment a3_batching: write Engine.step",
            "while True:\n            pass\n        raise NotImplementedError('",
        )
    )
    result = grade(
        edition, tmp_path / "grades", time_limit_s=20, only=["a2_blocks", "a3_batching", "a4_vtc"]
    )
    by_name = {g["name"]: g for g in result["assignments"]}
    assert by_name["a4_vtc"]["points"] == by_name["a4_vtc"]["max_points"]
    assert by_name["a2_blocks"]["points"] == 0 and "could not take" in by_name["a2_blocks"]["note"]
    assert by_name["a3_batching"]["points"] == 0 and "timed out" in by_name["a3_batching"]["note"]


def test_the_edition_s_lessons_have_no_solutions_and_their_checks_fail_untouched(tmp_path):
    """Lesson 5 of the student edition, run top to bottom, stops at its first exercise's
    self-check (the answer is still None); the repository's copy runs through (its solution
    cells fill the answers in: tests/test_lessons.py)."""
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    edition = release(tmp_path / "edition")
    for path in (edition / "lessons").glob("*.ipynb"):
        cells = json.loads(path.read_text())["cells"]
        assert not any("solution" in c.get("metadata", {}).get("tags", []) for c in cells), path
    book = nbformat.read(edition / "lessons" / "05_virtual_token_counter.ipynb", as_version=4)
    resources = {"metadata": {"path": str(edition / "lessons")}}
    client = nbclient.NotebookClient(book, timeout=120, kernel_name="python3", resources=resources)
    with pytest.raises(nbclient.exceptions.CellExecutionError) as failure:
        client.execute()
    assert "assert u == fairness_bound(1024, 10000)" in str(failure.value)  # exercise 1


def test_render_writes_a_lesson_with_its_outputs_and_without_its_solutions(tmp_path, capsys):
    """Lesson 1 rendered: its figure (drawn by plt.show) and its checks' outputs are in the
    page; its solution cells' code is not, while the check cells' code is (so the search would
    find it); the index links the page."""
    pytest.importorskip("nbclient")
    pytest.importorskip("nbconvert")
    import html
    import re

    import nbformat

    from minivtc.course.render import LESSONS, render

    index = render(tmp_path, only=["01"])
    assert re.search(r"01_forward_pass: \d+\.\d s", capsys.readouterr().err)  # progress
    page = (tmp_path / "01_forward_pass.html").read_text()
    text = html.unescape(re.sub(r"<[^>]+>", "", page))  # the code as a reader sees it
    assert re.search(r'<img [^>]*src="data:image/png;base64,', page)  # the figure, embedded
    assert re.search("^correct: [0-9,]+ parameters", text, re.MULTILINE)  # a check's output
    cells = nbformat.read(LESSONS / "01_forward_pass.ipynb", as_version=4).cells
    solutions = [i for i, c in enumerate(cells) if "solution" in c.metadata.get("tags", [])]
    assert solutions
    elsewhere = "\n".join(c.source for i, c in enumerate(cells) if i not in solutions)
    for i in solutions:
        assert cells[i + 1].source.strip().splitlines()[0] in text  # the check stays
        lines = {line.strip() for line in cells[i].source.splitlines()} - {""}
        own = [line for line in lines if line not in elsewhere]  # the solution's own code
        assert own and not [line for line in own if line in text], own
    assert '<a href="01_forward_pass.html">Lesson 1' in index.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["01_forward_pass.html", "index.html"]


HELPED = textwrap.dedent("""
    import math


    class A:
        def f(self, x):
            return self.twice(x) + half(x)

        def g(self):
            return "changed"

        def twice(self, x):
            return 2 * x


    def half(x):
        return math.floor(x / 2)
""")
REFERENCE = textwrap.dedent("""
    class A:
        def f(self, x):
            raise NotImplementedError

        def g(self):
            return "reference"
""")


def test_take_carries_the_student_s_helpers_and_names_what_it_leaves():
    """The named function, with the method, function and import it needs, is taken; a change
    to another of the reference's methods is not, and is reported by name."""
    source, left = take(REFERENCE, HELPED, ["A.f"])
    namespace: dict = {}
    exec(source, namespace)
    a = namespace["A"]()
    assert a.f(5) == 12 and a.g() == "reference"
    assert left == ["your changes to A.g were not taken (only new helpers are)"]
    _, left = take(REFERENCE, HELPED.replace("def g(self):", "def g2(self):"), ["A.f"])
    assert left == ["you removed A.g; the reference's is used"]


def test_failed_tests_are_read_with_a_student_s_name_and_the_first_message(tmp_path):
    from minivtc.course.feedback import read_report

    tests = tmp_path / "test_x.py"
    tests.write_text('def test_the_lift():\n    """The lift never lowers a counter. More."""\n')
    report = tmp_path / "report.xml"
    report.write_text(
        '<testsuites><testsuite tests="3"><testcase name="test_ok"/>'
        '<testcase name="test_the_lift"><failure message="AssertionError: lowered to 3&#10;'
        'assert 3 == 5">trace</failure></testcase>'
        '<testcase name="test_two_words[x 1]"><error message="boom"/></testcase>'
        "</testsuite></testsuites>"
    )
    total, failures = read_report(report, tests)
    assert total == 3
    assert [(f.name, f.message) for f in failures] == [
        ("The lift never lowers a counter", "lowered to 3"),
        ("two words (x 1)", "boom"),
    ]


def test_the_edition_states_the_helpers_rule_and_ships_no_wrong_solutions(tmp_path):
    edition = release(tmp_path / "edition")
    assert (
        "every function, method, class and\nimport you *add*" in (edition / "README.md").read_text()
    )
    assert not (edition / "minivtc/course/wrong.py").exists()
    assert not (edition / "minivtc/course/check.py").exists()


def edition_with(tmp_path, file: str, old: str, new: str):
    """A released edition whose `file` is the reference's, with `old` replaced by `new`."""
    from minivtc.course.edition import PACKAGE

    edition = release(tmp_path / "edition")
    source = (PACKAGE / file).read_text()
    assert source.count(old) == 1, old
    (edition / "minivtc" / file).write_text(source.replace(old, new))
    return edition


@pytest.mark.slow
def test_a_correct_a4_with_a_helper_of_its_own_gets_full_marks(tmp_path):
    """VTC.peek calling a method and a function the student added, with an import of theirs,
    and a change to VTC.join (not theirs): full marks, and the change named in the note."""
    edition = edition_with(
        tmp_path,
        "core/vtc.py",
        "        client = self.least.least()\n        return None if",
        "        client = self.my_least()\n        return None if",
    )
    path = edition / "minivtc/core/vtc.py"
    path.write_text(
        path.read_text()
        .replace(
            "from collections import deque\n", "import operator\nfrom collections import deque\n"
        )
        .replace(
            "    # helpers\n",
            "    # helpers\n\n    def my_least(self):\n        return mine(self)\n",
        )
        .replace("        self.ran_while_empty.clear()  # Q", "        pass  # Q")
        + "\n\ndef mine(vtc):\n    return operator.methodcaller('least')(vtc.least)\n"
    )
    result = grade(edition, tmp_path / "out", only=["a4_vtc"])
    (g,) = result["assignments"]
    assert g["points"] == g["max_points"] == 30, g
    assert "your changes to VTC.join were not taken" in g["note"], g


@pytest.mark.slow
def test_each_failed_test_is_named_with_its_message_in_the_table_and_grades_json(tmp_path):
    from minivtc.course.grade import table

    edition = edition_with(
        tmp_path,
        "core/vtc.py",
        "floor is not None and floor > self.counters[client]",
        "floor is not None",
    )
    result = grade(edition, tmp_path / "out", only=["a4_vtc"])
    (g,) = result["assignments"]
    assert 0 < g["points"] < 30, g
    names = {f["name"]: f["message"] for f in g["failures"]}
    lift = "The lift raises a joining client to the smallest waiting counter, never lowers one"
    assert lift in names and "a lift is max(c_u, floor)" in names[lift], names
    assert f"failed: {lift}: a joined with counter" in table(result)
    saved = json.loads((tmp_path / "out/grades.json").read_text())
    assert saved["assignments"][0]["failures"] == g["failures"]


@pytest.mark.slow
def test_the_same_submission_gets_the_same_points_every_time(tmp_path):
    """Three gradings of one submission (a4 whose output charges ignore the weights: it fails
    the derandomized property tests of weighted VTC): identical, failures and all."""
    edition = edition_with(
        tmp_path,
        "core/vtc.py",
        ") / weights.get(request.client_id, 1.0)",
        ")",
    )
    runs = [grade(edition, tmp_path / f"out{i}", only=["a4_vtc"]) for i in range(3)]
    assert runs[0]["total"] < 30 and runs[0] == runs[1] == runs[2], runs


@pytest.mark.slow
def test_grade_verbose_prints_the_tests_whole_output(tmp_path, capsys):
    from minivtc.cli import main

    argv = ["course", "grade", "--reference", "--out", str(tmp_path), "--only", "a5_metric"]
    assert main(argv) == 0
    assert "passed in" not in capsys.readouterr().err
    assert main([*argv, "--verbose"]) == 0
    err = capsys.readouterr().err
    assert "--- a5_metric: the tests' output ---" in err and "6 passed in" in err


@pytest.mark.slow
def test_a_student_tests_one_assignment_on_their_edition_as_it_stands(tmp_path, capsys):
    """`minivtc course test a5` in a fresh edition: 0, with each failure named; with a5's
    function written (the reference's): full marks. The edition has its own pyproject.toml."""
    import tomllib

    from minivtc.cli import main
    from minivtc.course.edition import PACKAGE

    edition = release(tmp_path / "edition")
    project = tomllib.loads((edition / "pyproject.toml").read_text())
    assert project["project"]["name"] == "minivtc"
    assert project["tool"]["pytest"]["ini_options"]["testpaths"] == ["minivtc/course/graded"]
    assert main(["course", "test", "a5", str(edition)]) == 1
    out = capsys.readouterr().out
    assert "a5_metric" in out and "failed: Table 2's FCFS and VTC rows" in out, out
    metrics = "harness/metrics.py"
    (edition / "minivtc" / metrics).write_text((PACKAGE / metrics).read_text())
    assert main(["course", "test", "a5_metric", str(edition)]) == 0
    assert not (edition / "report.xml").exists()
