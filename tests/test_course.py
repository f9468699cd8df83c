"""Coursework: the student edition, the source surgery behind it, and the grader.

Both directions the course relies on: the reference scores full marks, and a fresh student
edition scores 0 on every assignment (the graded tests can fail). A submission that does not
parse or hangs scores 0 for that assignment alone."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from minivtc.course.assignments import ASSIGNMENTS
from minivtc.course.edition import release
from minivtc.course.grade import grade
from minivtc.course.surgery import splice, stub, take
from tests.answers import code_lines, leaked, page_text, reference_bodies

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

    from minivtc.course.edition import PACKAGE
    from minivtc.course.surgery import find

    for a in ASSIGNMENTS:
        for file, qualname in a.reference_functions:
            find(ast.parse((PACKAGE / file).read_text()), qualname)
        assert a.functions or a.own_file, a.key


@pytest.mark.slow
def test_the_reference_gets_full_marks_and_a_fresh_edition_none(tmp_path):
    reference = grade(None, tmp_path / "reference")
    assert reference["total"] == reference["max_total"] == 210, reference  # 160 + d1, d2
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
    for file in ("fairness/vtc.py", *VTC_FILES):
        (mine / file).write_text((PACKAGE / file).read_text())
    kv = mine / "engine/kv_pool.py"
    kv.write_text(kv.read_text() + "\ndef broken(:\n")
    engine = mine / "engine/engine.py"
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


@pytest.mark.slow
def test_the_edition_s_lessons_have_no_solutions_and_their_checks_fail_untouched(tmp_path):
    """Lesson 5 of the student edition, run top to bottom, stops at its first exercise's
    self-check (the answer is still None); the repository's copy runs through (its solution
    cells fill the answers in: tests/test_lessons.py)."""
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    edition = release(tmp_path / "edition")
    books = sorted((edition / "lessons").rglob("*.ipynb"))
    assert any(p.parent.name == "problems" for p in books), "the problem sets are in the edition"
    for path in books:
        cells = json.loads(path.read_text())["cells"]
        assert not any("solution" in c.get("metadata", {}).get("tags", []) for c in cells), path
    book = nbformat.read(edition / "lessons" / "05_virtual_token_counter.ipynb", as_version=4)
    resources = {"metadata": {"path": str(edition / "lessons")}}
    client = nbclient.NotebookClient(book, timeout=120, kernel_name="python3", resources=resources)
    with pytest.raises(nbclient.exceptions.CellExecutionError) as failure:
        client.execute()
    assert "trace = prompt_heavy(M)" in str(failure.value)  # exercise 1


def test_the_grep_finds_every_reference_body_where_it_is():
    """The check below can fail: run on the package's own files, it finds every body."""
    from minivtc.course.edition import PACKAGE

    reference = reference_bodies()
    assert len(reference[0]) == sum(len(a.reference_functions) for a in ASSIGNMENTS)
    files = {f for a in ASSIGNMENTS for f, _ in a.reference_functions}
    text = "\n".join((PACKAGE / f).read_text() for f in sorted(files))
    assert leaked(reference, text) == list(reference[0])


def test_the_released_edition_holds_no_reference_body(tmp_path):
    """No file of the student edition (its package, lessons, README) holds three consecutive
    lines of any assignment function's reference body, nor of the capstone's answer (DRR)."""
    edition = release(tmp_path / "edition")
    bodies = reference_bodies()
    for path in sorted(edition.rglob("*")):
        if path.suffix in (".py", ".ipynb", ".md", ".toml"):
            text = path.read_text()
            if path.suffix == ".ipynb":
                cells = json.loads(text)["cells"]
                text = "\n".join("".join(c["source"]) for c in cells)
            assert not leaked(bodies, text), (path, leaked(bodies, text))


@pytest.mark.slow
def test_the_site_renders_both_editions_and_the_student_s_gives_no_answer_away(tmp_path):
    """Lessons 4 and 5 built as the site (`course site`), in a scratch copy of the lessons
    (nothing written into lessons/): the student pages hold no reference body, no solution's
    own code and no check's output, while the instructor's pages hold them; figures embedded;
    the indexes link every page. (Two lessons, about a minute: the whole site executes every
    lesson again, minutes more than tests/test_lessons.py already spends on them in CI.)"""
    pytest.importorskip("nbclient")
    pytest.importorskip("nbconvert")
    import re

    import nbformat

    from minivtc.course.render import LESSONS, site

    def snapshot():  # (not lessons/out/: what lessons running beside this test write, `-n`)
        files = [p for p in LESSONS.rglob("*") if p.relative_to(LESSONS).parts[0] != "out"]
        return {p: p.stat().st_mtime_ns for p in files}

    before = snapshot()
    index = site(tmp_path, only=["04", "05"])
    assert snapshot() == before, "the render wrote into lessons/"
    bodies = reference_bodies()
    front = index.read_text()
    for path in sorted(LESSONS.glob("0[45]_*.ipynb")):
        student = (tmp_path / "student" / f"{path.stem}.html").read_text()
        instructor = (tmp_path / "instructor" / f"{path.stem}.html").read_text()
        assert re.search(r'<img [^>]*src="data:image/png;base64,', student), path  # a figure
        assert not leaked(bodies, page_text(student)), (path, leaked(bodies, page_text(student)))
        cells = nbformat.read(path, as_version=4).cells
        solutions = [i for i, c in enumerate(cells) if "solution" in c.metadata.get("tags", [])]
        assert solutions, path
        elsewhere = "\n".join(c.source for i, c in enumerate(cells) if i not in solutions)
        for i in solutions:
            own = [x for x in code_lines(cells[i].source) if x not in elsewhere and len(x) > 12]
            assert own and not [x for x in own if x in page_text(student)], (path, own)
            assert all(x in page_text(instructor) for x in own), (path, own)
        student_checks = re.findall(r"^correct: .*$", page_text(student), re.MULTILINE)
        assert not student_checks, (path, student_checks)  # checks' outputs left out
        assert re.search(r"^correct: ", page_text(instructor), re.MULTILINE), path
        for edition in ("student", "instructor"):
            assert f'href="{edition}/{path.stem}.html"' in front
            assert f'href="{path.stem}.html"' in (tmp_path / edition / "index.html").read_text()


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


def test_take_carries_the_student_s_constants_and_names_a_changed_one():
    """A module constant and a class attribute the student adds, used by the named function
    (in a default argument too), are taken; a changed reference constant is not, by name."""
    reference = "LIMIT = 3\n\n\nclass A:\n    KIND = 'a'\n\n    def f(self, x):\n        raise 0\n"
    donor = textwrap.dedent("""
        LIMIT = 4
        SCALE = 10


        class A:
            KIND = 'a'
            OFFSET = 1

            def f(self, x, scale=SCALE):
                return x * scale + self.OFFSET + LIMIT
    """)
    source, left = take(reference, donor, ["A.f"])
    namespace: dict = {}
    exec(source, namespace)
    assert namespace["A"]().f(2) == 2 * 10 + 1 + 3  # the reference's LIMIT
    assert left == ["your change to LIMIT was not taken (the reference's value is used)"]


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
    ran, failures = read_report(report, tests)
    assert ran == ["test_ok", "test_the_lift", "test_two_words[x 1]"]
    assert [(f.name, f.message) for f in failures] == [
        ("The lift never lowers a counter", "lowered to 3"),
        ("two words (x 1)", "boom"),
    ]


def test_grading_in_the_student_edition_says_it_needs_the_reference(tmp_path):
    """The edition's package holds stubs where the reference has answers: `course grade` run
    with it would grade every assignment against stubs, so it refuses and names `course test`."""
    import subprocess
    import sys

    edition = release(tmp_path / "edition")
    assert "STUDENT_EDITION = True" in (edition / "minivtc/course/__init__.py").read_text()
    assert "minivtc course grade ." not in (edition / "README.md").read_text()
    done = subprocess.run(
        [sys.executable, "-m", "minivtc", "course", "grade", "."],
        cwd=edition,
        env={**os.environ, "PYTHONPATH": str(edition)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "minivtc course test" in done.stderr, done.stderr


def test_every_lesson_states_the_assignments_it_needs_and_the_edition_lists_them(tmp_path):
    from minivtc.course.edition import REPOSITORY, lesson_needs

    needs = lesson_needs(REPOSITORY / "lessons")
    assert len(needs) == 16 and all(needs.values()), needs  # each lesson runs some of the package
    text = (release(tmp_path / "edition") / "README.md").read_text()
    assert "0: a1, a2, a3, a4; 1: a1; 2: a1, a2, a3" in " ".join(text.split()), text


@pytest.mark.slow
@pytest.mark.parametrize("lesson", ["01", "04", "05", "14"])
def test_a_lesson_runs_on_an_edition_with_just_the_assignments_it_states(
    lesson, tmp_path, monkeypatch
):
    """The instructor's lesson (its solutions in) runs top to bottom on a student edition's
    package in which only the assignments its first cell names are done (the reference's
    functions put in) and every other assignment is still a stub. (The cheaper lessons: the
    rest were checked the same way by hand, minivtc/course/README.md.)"""
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    from minivtc.course.edition import PACKAGE, REPOSITORY, lesson_needs

    edition = release(tmp_path / "edition")
    done = lesson_needs(REPOSITORY / "lessons")[lesson]
    for a in ASSIGNMENTS:
        for file, qualname in a.functions if a.key.split("_")[0] in done else ():
            path = edition / "minivtc" / file
            path.write_text(splice(path.read_text(), (PACKAGE / file).read_text(), qualname))
    monkeypatch.setenv("PYTHONPATH", str(edition))  # the kernel imports the edition's package
    monkeypatch.setenv("MINIVTC_LESSON_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    (path,) = (REPOSITORY / "lessons").glob(f"{lesson}_*.ipynb")
    book = nbformat.read(path, as_version=4)
    where = {"metadata": {"path": str(edition / "lessons")}}
    NotebookClient(book, timeout=600, kernel_name="python3", resources=where).execute()
    printed = "".join(o.get("text", "") for c in book.cells for o in c.get("outputs", []))
    assert "NotImplementedError" not in printed


@pytest.mark.slow
def test_the_edition_installs_on_its_own_and_its_package_is_the_students(tmp_path):
    """`pip install` of the released edition (no dependencies fetched: they are this
    environment's), into a folder of its own: the installed package is the student edition's,
    its graded tests and package data included."""
    import subprocess
    import sys

    edition = release(tmp_path / "edition")
    target = tmp_path / "installed"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    done = subprocess.run([*pip, "--target", str(target), str(edition)], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    assert (target / "minivtc/course/graded/test_a4_pick.py").is_file()
    assert (target / "minivtc/serving/dashboard.html").is_file()  # package data
    script = "import minivtc.course as c, minivtc.fairness.vtc as v\n"
    script += "print(c.STUDENT_EDITION, v.__file__)"
    env = {**os.environ, "PYTHONPATH": str(target)}
    shown = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert shown.stdout.split() == ["True", str(target / "minivtc/fairness/vtc.py")], shown


def test_the_edition_states_the_helpers_rule_and_ships_no_wrong_solutions(tmp_path):
    edition = release(tmp_path / "edition")
    assert (
        "every function, method, class,\nconstant and import you *add*"
        in (edition / "README.md").read_text()
    )
    assert not (edition / "minivtc/course/wrong.py").exists()
    assert not (edition / "minivtc/course/wrong_policies.py").exists()
    assert not (edition / "minivtc/course/check.py").exists()


# Beside vtc.py, the files of a4's and a4b's other functions (the counter structure, the fair
# victim, fair preemption's lift): an edition that solved VTC solved these too. (a3's admission
# round, which a4's bench runs, is the staff's in `course test a4`, as the reference's in grading.)
VTC_FILES = ("fairness/least_counter.py", "engine/preemption.py", "fairness/fair_lift.py")


def edition_with(tmp_path, file: str, old: str, new: str):
    """A released edition whose `file` is the reference's, with `old` replaced by `new` (and,
    for vtc.py, `VTC_FILES` the reference's)."""
    from minivtc.course.edition import PACKAGE

    edition = release(tmp_path / "edition")
    source = (PACKAGE / file).read_text()
    assert source.count(old) == 1, old
    (edition / "minivtc" / file).write_text(source.replace(old, new))
    for other in VTC_FILES if file == "fairness/vtc.py" else ():
        (edition / "minivtc" / other).write_text((PACKAGE / other).read_text())
    return edition


@pytest.mark.slow
def test_a_correct_a4_with_a_helper_of_its_own_gets_full_marks(tmp_path):
    """VTC.peek calling a method and a function the student added, with an import of theirs,
    and a change to VTC.requeue (not theirs): full marks, and the change named in the note."""
    edition = edition_with(
        tmp_path,
        "fairness/vtc.py",
        "        client = self.least.least()\n        return None if",
        "        client = self.my_least()\n        return None if",
    )
    path = edition / "minivtc/fairness/vtc.py"
    edits = [
        ("from collections import deque\n", "import operator\nfrom collections import deque\n"),
        (
            "    def meet(self,",
            "    def my_least(self):\n        return mine(self)\n\n    def meet(self,",
        ),
        (
            "            self.queues[request.client_id].appendleft(request)\n",
            "            self.queues[request.client_id].appendleft(request)\n            pass\n",
        ),
    ]
    text = path.read_text()
    for old, new in edits:
        assert text.count(old) == 1, old  # the student's edit lands where it is meant to
        text = text.replace(old, new)
    path.write_text(
        text + "\n\ndef mine(vtc):\n    return operator.methodcaller('least')(vtc.least)\n"
    )
    result = grade(edition, tmp_path / "out", only=["a4_vtc"])
    (g,) = result["assignments"]
    assert g["points"] == g["max_points"] == 25, g
    assert "your changes to VTC.requeue were not taken" in g["note"], g


@pytest.mark.slow
def test_each_failed_test_is_named_with_its_message_in_the_table_and_grades_json(tmp_path):
    from minivtc.course.grade import table

    edition = edition_with(
        tmp_path,
        "fairness/vtc.py",
        "floor is not None and floor > self.counters[client]",
        "floor is not None",
    )
    result = grade(edition, tmp_path / "out", only=["a4_vtc"])
    (g,) = result["assignments"]
    assert 0 < g["points"] < 25, g
    names = {f["name"]: f["message"] for f in g["failures"]}
    lift = "The lift raises a joining client to the smallest waiting counter, never lowers one"
    assert lift in names and "a lift is max(c_u, floor)" in names[lift], names
    assert f"failed: {lift}: a joined with counter" in table(result)
    saved = json.loads((tmp_path / "out/grades.json").read_text())
    assert saved["assignments"][0]["failures"] == g["failures"]


@pytest.mark.slow
def test_the_same_submission_gets_the_same_points_every_time(tmp_path):
    """Two gradings of one submission (a4b whose output charges ignore the weights: it fails
    the derandomized property tests of weighted VTC), the student's way (in the sandbox,
    through the channel) and the instructor's (trusted, in the tests' own package): identical,
    failures and all, so neither the examples drawn nor the sandbox moves a point."""
    edition = edition_with(
        tmp_path,
        "fairness/vtc.py",
        ") / weights.get(request.client_id, 1.0)",
        ")",
    )
    runs = [
        grade(edition, tmp_path / f"out{i}", only=["a4b_variants"], trust_submissions=trusted)
        for i, trusted in enumerate((False, True))
    ]
    assert runs[0]["total"] < 30 and runs[0] == runs[1], runs


@pytest.mark.slow
def test_grade_verbose_prints_the_tests_whole_output(tmp_path, capsys):
    from minivtc.cli.main import main

    argv = ["course", "grade", "--reference", "--out", str(tmp_path), "--only", "a5_metric"]
    assert main(argv) == 0
    assert "passed in" not in capsys.readouterr().err
    assert main([*argv, "--verbose"]) == 0
    err = capsys.readouterr().err
    assert "--- a5_metric: the tests' output ---" in err and "6 passed in" in err


@pytest.mark.slow
def test_a_passing_capstone_is_told_its_slack(tmp_path, capsys):
    """`course grade` on a capstone that passes (the instructor's answer) prints its slack, the
    stated bound over the worst gap on the adversarial workloads, and saves it: not only a
    failure's message reports it."""
    from minivtc.cli.main import main

    argv = ["course", "grade", "--reference", "--out", str(tmp_path), "--only", "a6_fair"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    (g,) = json.loads((tmp_path / "grades.json").read_text())["assignments"]
    assert g["points"] == 30 and not g["failures"], g
    (slack,) = g["reported"]
    assert slack.startswith("slack ") and 1 <= float(slack.split()[1]) <= 3, slack
    assert f"reported: {slack}" in out, out


@pytest.mark.slow
def test_a_student_tests_one_assignment_on_their_edition_as_it_stands(tmp_path, capsys):
    """`minivtc course test a5` in a fresh edition: 0, with each failure named; with a5's
    function written (the reference's): full marks. The edition has its own pyproject.toml."""
    import tomllib

    from minivtc.cli.main import main
    from minivtc.course.edition import PACKAGE

    edition = release(tmp_path / "edition")
    project = tomllib.loads((edition / "pyproject.toml").read_text())
    assert project["project"]["name"] == "minivtc"
    assert project["tool"]["pytest"]["ini_options"]["testpaths"] == ["minivtc/course/graded"]
    assert main(["course", "test", "a5", str(edition)]) == 1
    out = capsys.readouterr().out
    assert "a5_metric" in out and "failed: Table 2's FCFS and VTC rows" in out, out
    metrics = "sim/metrics.py"
    (edition / "minivtc" / metrics).write_text((PACKAGE / metrics).read_text())
    assert main(["course", "test", "a5_metric", str(edition)]) == 0
    assert not (edition / "report.xml").exists()


@pytest.mark.slow
def test_the_bench_serves_as_the_engine_does_step_by_step():
    """a4's and a6's bench (`graded/testbed.py`, no engine) gives the service and backlogs the
    real engine gives (`driver.drive`: the engine with a unit runner), step by step, for VTC
    (with its fairness check), weighted VTC, FCFS and DRR on random workloads."""
    from hypothesis import given, settings

    from minivtc.course.graded.driver import drive, random_arrivals, workloads
    from minivtc.course.graded.testbed import serve
    from minivtc.fairness.drr import DRR
    from minivtc.fairness.scheduler import FCFS
    from minivtc.fairness.vtc import VTC

    policies = [
        (VTC, True),
        (lambda: VTC(weights={"c0": 2.0}), True),
        (FCFS, False),
        (lambda: DRR(32.0), True),
    ]

    @settings(deadline=None, derandomize=True, database=None, max_examples=30)
    @given(workloads)
    def same(w):
        arrivals = random_arrivals(w)
        for make, fairness in policies:
            _, engine, refused = drive(make(), arrivals, w["kv_tokens"], fairness=fairness)
            _, bench, rejected = serve(make(), arrivals, w["kv_tokens"], fairness=fairness)
            assert [(s.backlogged, s.service) for s in bench] == [
                (s.backlogged, s.service) for s in engine
            ]
            assert len(rejected) == len(refused)

    same()


@pytest.mark.slow
def test_a6_s_recorded_vtc_numbers_are_the_package_s_vtc_on_the_bench():
    """a6 compares a policy with VTC on the paper's workloads without running VTC (a4's): its
    recorded gaps and throughputs are what the package's VTC gives on the bench."""
    from minivtc.course.graded.test_a6_fair import VTC_ON_A10G
    from minivtc.course.graded.testbed import clients_of, on_a10g, throughput, worst_gap
    from minivtc.fairness.vtc import VTC

    for name, (gap, tokens_per_s) in VTC_ON_A10G.items():
        bench, steps = on_a10g(VTC(), name)
        assert worst_gap(steps, clients_of(bench))[0] == gap, name
        assert throughput(bench) == pytest.approx(tokens_per_s, abs=1e-3), name


def test_every_graded_test_is_on_one_rubric_line_and_every_line_is_a_sixth_at_least():
    """Each assignment's rubric names every graded test once, and nothing else; no line is
    worth less than a sixth of the assignment (a wrong mechanism costs at least that)."""
    import ast

    from minivtc.course.edition import PACKAGE

    for a in ASSIGNMENTS:
        trees = [ast.parse((PACKAGE / file).read_text()) for file in a.test_files]
        found = [
            n.name
            for tree in trees
            for n in tree.body
            if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
        ]
        named = [t for line in a.rubric for t in line.tests]
        assert len(found) == len(set(found)), a.key  # no name in two of its files
        tests = set(found)
        assert sorted(named) == sorted(tests), (a.key, set(named) ^ tests)
        assert all(6 * line.points >= a.max_points for line in a.rubric), a.key


def test_a_mechanism_s_points_are_lost_when_any_of_its_tests_fails_or_does_not_run():
    from minivtc.course.grade import rubric

    (a4,) = [a for a in ASSIGNMENTS if a.key == "a4_vtc"]
    ran = [t for line in a4.rubric for t in line.tests]
    lift = a4.rubric[1]
    failed = [{"name": "the lift", "mechanism": lift.mechanism}]
    lines = rubric(a4, ran, failed)
    assert [x["points"] for x in lines] == [5, 0, 5, 5, 5]
    assert lines[1]["failed"] == ["the lift"] and lines[1]["max_points"] == 5
    lines = rubric(a4, [t for t in ran if t != a4.rubric[0].tests[0]], [])
    assert [x["points"] for x in lines] == [0, 5, 5, 5, 5]
    assert lines[0]["failed"][0].endswith("(did not run)")


def test_a_capstone_that_reaches_for_a_reference_policy_is_refused_by_name():
    """VTC, DRR, the artifact's VTC and the module that builds them by name are refused, by
    import or by name; the scheduler interface and the cost are the student's to use."""
    from minivtc.course.rules import out_of_reach, refusals

    assert (
        "from minivtc.fairness.vtc import VTC"
        in refusals("from minivtc.fairness.vtc import VTC\n")[0]
    )
    assert refusals("from minivtc.fairness import drr\n")
    assert refusals("import minivtc.fairness.policies\n")
    assert refusals("import importlib\nimportlib.import_module('minivtc.fairness.vtc')\n")
    own = (
        "from minivtc.fairness.scheduler import Scheduler\nfrom minivtc.fairness.cost import W_P\n"
    )
    assert not refusals(own)
    assert not refusals("from minivtc.fairness.drr import DRR\n", ("fairness/drr.py",))
    namespace: dict = {}
    exec(out_of_reach("a6_fair", "fairness/vtc.py"), namespace)
    with pytest.raises(NotImplementedError, match="VTC is a reference policy, out of reach"):
        namespace["VTC"]()


@pytest.mark.slow
def test_course_test_and_course_grade_agree_and_name_a_rule_broken(tmp_path):
    """A correct a4 whose VTC.__init__ sets an attribute its peek uses: the change to
    `__init__` is not taken, by `course test` (on the edition) as by `course grade` (in the
    reference), so both score it alike and both name the rule; a capstone subclassing VTC is
    refused by name in both."""
    from minivtc.course.edition import PACKAGE
    from minivtc.course.grade import test_edition

    edition = edition_with(
        tmp_path,
        "fairness/vtc.py",
        "        client = self.least.least()\n        return None if",
        "        client = self.my_least.least()\n        return None if",
    )
    path = edition / "minivtc/fairness/vtc.py"
    path.write_text(
        path.read_text().replace(
            "        self.least = self.Least(self.counters, self.first_seen, self.queues)\n",
            "        self.least = self.Least(self.counters, self.first_seen, self.queues)\n"
            "        self.my_least = self.least\n",
        )
    )
    (edition / "minivtc/course/capstone.py").write_text(
        '"""Mine."""\n\nfrom minivtc.fairness.vtc import VTC\n\n\nclass FairPolicy(VTC):\n'
        '    BOUND = "2U"\n'
    )
    for key in ("a4_vtc", "a6_fair"):
        graded = grade(edition, tmp_path / f"out-{key}", only=[key])
        tested = test_edition(key, edition)
        assert graded == tested, (graded, tested)
    assert (
        graded["total"] == 0
        and "refused: your capstone uses from minivtc.fairness.vtc"
        in (graded["assignments"][0]["note"])
    )
    (g,) = test_edition("a4_vtc", edition)["assignments"]
    assert g["points"] < 25 and "your changes to VTC.__init__ were not taken" in g["note"], g
    (path).write_text((PACKAGE / "fairness/vtc.py").read_text())
    assert test_edition("a4_vtc", edition)["total"] == 25


def test_the_edition_cites_no_file_it_lacks_and_names_every_lesson_an_assignment_grades(tmp_path):
    """No lesson of the edition cites the repository's tests/ (the edition has none); a4's and
    a4b's rows name the lessons whose mechanisms they grade; the README prints each rubric, the
    lines each answer takes, and tells the student to install the edition only."""
    edition = release(tmp_path / "edition")
    for path in sorted((edition / "lessons").rglob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        assert not any("tests/" in "".join(c["source"]) for c in cells), path
    text = " ".join((edition / "README.md").read_text().split())
    row = text.split("| a4_vtc |")[1].split(" | | ")[0]  # up to the next row
    assert all(f"{n} (" in row for n in ("Lessons 5", "7")) and "8 (" not in row, row
    row = text.split("| a4b_variants |")[1].split(" | | ")[0]
    assert all(f"{n} (" in row for n in ("Lessons 8", "10", "11", "13")), row
    assert "### a4_vtc (25 points)" in text and "the lift, both cases" in text
    assert "### a4b_variants (30 points)" in text
    assert "Install this edition, and only this edition" in text
    assert (edition / "minivtc/course/released/fairness/vtc.py").is_file()
