"""The design assignments (d1, d2): the answer and the hidden seed stay the instructor's, the
grader gives the answer full marks, and its watch catches what a policy must never do."""

from __future__ import annotations

import subprocess
import sys

import pytest

from minivtc.course import sandbox
from minivtc.course.assignments import ASSIGNMENTS
from minivtc.course.edition import PACKAGE, release
from minivtc.course.grade import CHANNEL, grade_one
from minivtc.course.graded.design_bench import (
    PUBLIC_SEEDS,
    Watched,
    quota_workload,
    seeds,
    tenant_workload,
)
from minivtc.course.graded.driver import Arrival
from minivtc.course.graded.testbed import serve
from minivtc.course.instructor.hidden import DEFAULT_SEED, SEED_VARIABLE, seed
from minivtc.course.rules import put_out_of_reach
from minivtc.fairness.scheduler import FCFS

DESIGN = [a for a in ASSIGNMENTS if a.key in ("d1_quota", "d2_tenants")]


def test_the_design_assignments_come_last_with_their_answers_in_the_instructor_folder():
    assert [a.key for a in ASSIGNMENTS[-2:]] == ["d1_quota", "d2_tenants"]
    for a in DESIGN:
        assert a.own_file and a.answer
        assert all(f.startswith("course/instructor/") for f, _ in a.answer), a.key


@pytest.mark.slow  # a grading each (about 10 s); the quick run runs the graded tests themselves
@pytest.mark.parametrize("a", DESIGN, ids=lambda a: a.key)
def test_the_grader_gives_the_instructor_s_answer_full_marks(a):
    grade = grade_one(a, None)
    assert grade.points == a.max_points, (grade.note, grade.failures[:1])


@pytest.mark.slow  # a grading each (about 30 s): the answer in the sandbox, through the channel
@pytest.mark.skipif(sandbox.why_not() is not None, reason=str(sandbox.why_not()))
@pytest.mark.parametrize("a", DESIGN, ids=lambda a: a.key)
def test_the_answer_as_a_student_s_file_gets_full_marks_through_the_channel(a, tmp_path):
    """The answer pasted into the edition's file (its base class, `QuotaVTC`, the student's own
    there): the tests run outside the sandbox, the policy lives in it (`grade.LIVE`)."""
    (answer,) = {f for f, _ in a.answer}
    own = (PACKAGE / (a.own_file or "")).read_text()
    imported = next(line for line in own.splitlines() if "course.instructor" in line)
    policy = own[own.index(imported) + len(imported) :]
    pasted = (PACKAGE / answer).read_text() + policy.replace(COST_IMPORT, "")
    (tmp_path / "minivtc" / (a.own_file or "")).parent.mkdir(parents=True)
    (tmp_path / "minivtc" / (a.own_file or "")).write_text(pasted)
    grade = grade_one(a, tmp_path)
    assert a.key in CHANNEL and grade.points == a.max_points, (grade.note, grade.failures[:1])


COST_IMPORT = "from minivtc.fairness.cost import PAPER_COST, Cost\n"


def test_grading_draws_hidden_workloads_and_the_same_ones_every_time():
    hidden = seeds(1)
    assert hidden == seeds(1) and len(hidden) == len(PUBLIC_SEEDS)
    assert not set(hidden) & set(PUBLIC_SEEDS) and hidden != seeds(2)


def test_the_instructor_s_seed_variable_changes_the_hidden_workloads(monkeypatch):
    """`MINIVTC_HIDDEN_SEED` replaces the committed seed, without editing the package; unset
    (as in CI), grading draws from the committed default, unchanged."""
    monkeypatch.delenv(SEED_VARIABLE, raising=False)
    assert DEFAULT_SEED == 20270117 and seed() == DEFAULT_SEED
    default = {salt: seeds(salt) for salt in (1, 2)}
    monkeypatch.setenv(SEED_VARIABLE, str(DEFAULT_SEED))
    assert {salt: seeds(salt) for salt in (1, 2)} == default
    monkeypatch.setenv(SEED_VARIABLE, " 424242 ")
    assert seed() == 424242
    for salt in (1, 2):
        own = seeds(salt)
        assert not set(own) & (set(default[salt]) | set(PUBLIC_SEEDS)), salt
        assert len(own) == len(PUBLIC_SEEDS) and own == seeds(salt)
    assert quota_workload(seeds(1)[0]) != quota_workload(default[1][0])
    assert tenant_workload(seeds(2)[0]) != tenant_workload(default[2][0])
    monkeypatch.setenv(SEED_VARIABLE, "term-two")
    with pytest.raises(ValueError, match=SEED_VARIABLE):
        seeds(1)


def test_the_edition_holds_neither_answer_nor_seed_and_tests_on_the_public_workloads(tmp_path):
    edition = release(tmp_path / "edition")
    assert not (edition / "minivtc" / "course" / "instructor").exists()
    for a in DESIGN:
        text = (edition / "minivtc" / (a.own_file or "")).read_text()
        assert "instructor" not in text.split('"""')[-1], a.key  # the skeleton imports no answer
        assert "NotImplementedError" in text, a.key
    probe = "from minivtc.course.graded.design_bench import seeds; print(seeds(1))"
    env = {"PYTHONPATH": str(edition), "PATH": ""}
    command = [sys.executable, "-c", probe]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=edition)
    assert done.stdout.strip() == str(PUBLIC_SEEDS), done.stderr[-2000:]


def test_while_graded_the_answer_refuses_to_be_imported(tmp_path):
    (d1,) = [a for a in DESIGN if a.key == "d1_quota"]
    (answer,) = {f for f, _ in d1.answer}
    (tmp_path / answer).parent.mkdir(parents=True)
    (tmp_path / answer).write_text((PACKAGE / answer).read_text())
    (tmp_path / "fairness").mkdir()
    put_out_of_reach(d1, tmp_path)
    with pytest.raises(ImportError, match="out of reach"):
        exec((tmp_path / answer).read_text(), {})


def test_the_watch_catches_a_policy_that_ignores_the_quota():
    """FCFS knows no quota: it offers C's second request while C holds its whole quota."""
    arrivals = [Arrival(0.0, "C", 4, 4) for _ in range(3)]
    watch = Watched(FCFS(), {"C": 8})
    serve(watch, arrivals, 64)
    assert watch.broken and "over its quota" in watch.broken[0], watch.broken


def test_the_watch_catches_a_policy_that_holds_back_what_has_room():
    class Stingy(FCFS):
        def peek(self):  # offers nothing while anything runs
            return None if self.running else super().peek()

        running = False

        def dispatch(self, request):
            super().dispatch(request)
            self.running = True

        def on_finish(self, request):
            self.running = False

    watch = Watched(Stingy(), {})
    serve(watch, [Arrival(0.0, c, 4, 4) for c in "AB"], 64)
    assert watch.broken and "gave None" in watch.broken[0], watch.broken
