"""The student edition's staff code: every lesson runs in its own week, on no assignment done.

The edition carries each assignment function's reference code, compiled and marshalled
(`minivtc/course/staff.py`); a lesson's first code cell, `staff.use()`, runs it. Checked here:
it behaves as the reference does (a run through the model, the pool, the step, VTC and the
metric gives the reference's numbers, where the edition's own stubs raise); `course test KEY`
runs it for every assignment but KEY, as grading runs the reference's, never for KEY (a fresh
edition scores 0, and a submission calling `staff.use()` gains nothing); another Python is
refused; and the lessons run top to bottom on a fresh edition.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minivtc.course.edition import PACKAGE, REPOSITORY, on_staff_code, release

# One run through every assignment but the capstone: a1's model, a2's allocator, a3's
# reservation and step, a4's VTC (the engine drives it) and a5's metric on the simulator's run.
FINGERPRINT = """
import json, sys
import torch
from minivtc.course import staff
if sys.argv[1] == "staff":
    staff.use()
from minivtc.course.graded.driver import Arrival, drive
from minivtc.fairness.vtc import VTC
from minivtc.model.llama import CausalSequences
from minivtc.model.weights import load_model
from minivtc.sim.metrics import table_metrics
from minivtc.sim.simulator import simulate
from minivtc.sim.workloads import workload

model, _ = load_model()
with torch.no_grad():
    logits = model(torch.tensor([1, 5, 9, 2]), torch.arange(4), CausalSequences([4]))
arrivals = [Arrival(t, c, 4 + 3 * t if c == "a" else 2, 6) for t in range(6) for c in "ab"]
_, steps, _ = drive(VTC(), arrivals, kv_tokens=40)
w = workload("overload")
result = simulate(w.make(), "vtc", reservation="full")
metrics = table_metrics(result.served, result.total_time, horizon=w.duration)
print(json.dumps({
    "logits": round(float(logits.double().abs().sum()), 3),
    "counters": steps[-1].counters,
    "metrics": [round(v, 6) for v in vars(metrics).values()],
}))
"""


@pytest.fixture(scope="module")
def edition(tmp_path_factory) -> Path:
    return release(tmp_path_factory.mktemp("staff") / "edition")


def run(code: str, package: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(package)}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        cwd=package,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_staff_code_behaves_as_the_reference_and_the_stubs_do_not_run(edition):
    reference = run(FINGERPRINT, PACKAGE.parent, "reference")
    assert reference.returncode == 0, reference.stderr
    staff = run(FINGERPRINT, edition, "staff")
    assert staff.returncode == 0, staff.stderr
    assert json.loads(staff.stdout) == json.loads(reference.stdout)
    stubs = run(FINGERPRINT, edition, "stubs")  # the edition without staff.use()
    assert stubs.returncode != 0 and "NotImplementedError: Assignment a1_llama" in stubs.stderr


def test_the_edition_holds_the_staff_code_not_its_source(edition):
    text = (edition / "minivtc/course/staff_code.py").read_text()
    assert "TAG = 'cpython-" in text and "raise NotImplementedError" not in text
    source = (PACKAGE / "fairness/vtc.py").read_text()
    assert "def peek" in source and "def peek" not in text


def test_another_python_is_refused_with_a_message_naming_both(edition):
    code = (
        "import minivtc.course.staff_code as s; s.TAG = 'cpython-39'; s.PYTHON = '3.9'\n"
        "from minivtc.course import staff; staff.use()"
    )
    done = run(code, edition)
    assert done.returncode != 0
    assert "compiled for cpython-39 (Python 3.9)" in done.stderr
    assert f"Python {sys.version_info.major}.{sys.version_info.minor}" in done.stderr


def test_course_test_never_runs_the_staff_code(edition, tmp_path):
    """A fresh edition scores 0 in `course test` (a5's stubs are tested, not the staff's code
    beside them, which runs only for the other assignments), and a5 written as a call to
    `staff.use()` scores 0 too: it refuses where the graded tests run. (Grading a fresh edition
    gives 0 as well: tests/test_course.py.)"""
    from minivtc.course.grade import test_edition

    assert test_edition("a5_metric", edition)["total"] == 0
    metrics = edition / "minivtc/sim/metrics.py"
    original = metrics.read_text()
    stub = next(x for x in original.splitlines() if "NotImplementedError" in x and "a5_" in x)
    cheat = original.replace(
        stub,
        "    from minivtc.course import staff\n\n"
        "    staff.use()\n"
        "    return table_metrics(served, total_time, horizon, warmup, num_x, cost, demand_cost)",
    )
    assert cheat != original
    metrics.write_text(cheat)
    try:
        assert test_edition("a5_metric", edition)["total"] == 0
    finally:
        metrics.write_text(original)


@pytest.mark.slow
def test_course_test_runs_the_staffs_answers_for_every_other_assignment(tmp_path):
    """`course test KEY` scores what `course grade` does, whatever else the student has done:
    KEY's functions are the student's, every other assignment's the staff's compiled answers.
    a4 written (the reference's), a3 left as stubs: a4 gets full marks though its bench runs
    a3's admission round (on the tests' side), and a3's tests still meet its own stubs. a3
    written, a1, a2 and a4 left as stubs: its step, run in the sandbox, runs a1's model, a2's
    allocator and a4's VTC there, and `course test` gives what `course grade` gives."""
    import shutil

    from minivtc.course import sandbox
    from minivtc.course.edition import RELEASED
    from minivtc.course.grade import grade, test_edition

    edition = release(tmp_path / "edition")
    a4 = ("fairness/vtc.py", "fairness/least_counter.py")
    a3 = ("fairness/scheduler.py", "engine/admission.py", "engine/engine.py")
    for file in a4:
        (edition / "minivtc" / file).write_text((PACKAGE / file).read_text())
    assert test_edition("a4_vtc", edition)["total"] == 25
    (stubbed,) = test_edition("a3_batching", edition)["assignments"]
    assert stubbed["points"] == 0 and stubbed["failures"], stubbed
    assert all("Assignment a3_batching: write" in f["message"] for f in stubbed["failures"])
    for file in a4:
        shutil.copyfile(edition / RELEASED / file, edition / "minivtc" / file)
    for file in a3:
        (edition / "minivtc" / file).write_text((PACKAGE / file).read_text())
    tested = test_edition("a3_batching", edition)
    trusted = sandbox.why_not() is not None  # as `course test` runs it here
    graded = grade(edition, tmp_path / "out", only=["a3_batching"], trust_submissions=trusted)
    assert tested == graded, (tested, graded)
    lines = {line["mechanism"]: line for line in tested["assignments"][0]["rubric"]}
    for mechanism in ("the step:", "continuous batching with the real model"):
        (line,) = [x for name, x in lines.items() if name.startswith(mechanism)]
        assert line["points"] == line["max_points"], tested


LESSONS = sorted((REPOSITORY / "lessons").glob("[0-9][0-9]_*.ipynb"))
# Problem set 2's Problem 5 runs the instructor's DRR, which the edition leaves out (a6's
# answer): it is handed out after a6 is due, with its worked answer.
PROBLEMS = sorted((REPOSITORY / "lessons/problems").glob("01_*.ipynb"))
QUICK = ("04_what_is_fair", "05_virtual_token_counter")  # the cheapest lessons that drive VTC


def run_on_a_fresh_edition(path: Path, edition: Path, tmp_path: Path, monkeypatch) -> None:
    """The instructor's notebook (its solutions in, so its checks pass) with the cell the
    edition opens it with, `staff.use()`, run top to bottom on the edition's package with no
    assignment done."""
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    copy = tmp_path / path.name
    copy.write_text(path.read_text())
    on_staff_code(copy)
    monkeypatch.setenv("PYTHONPATH", str(edition))  # the kernel imports the edition's package
    monkeypatch.setenv("MINIVTC_LESSON_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    book = nbformat.read(copy, as_version=4)
    where = {"metadata": {"path": str(edition / "lessons" / path.parent.relative_to(LESSONS_AT))}}
    NotebookClient(book, timeout=600, kernel_name="python3", resources=where).execute()
    printed = "".join(o.get("text", "") for c in book.cells for o in c.get("outputs", []))
    assert "NotImplementedError" not in printed
    assert "correct" in printed  # its exercises' checks ran


LESSONS_AT = REPOSITORY / "lessons"


@pytest.mark.parametrize("path", [p for p in LESSONS if p.stem in QUICK], ids=lambda p: p.stem)
def test_a_lesson_runs_on_a_fresh_edition_in_its_own_week(path, edition, tmp_path, monkeypatch):
    run_on_a_fresh_edition(path, edition, tmp_path, monkeypatch)


# Beside the two quick ones, the lessons that run every assignment's staff code between them
# (a1-a3's engine, a4b's memory and preemption, a5's metric, the fleet) and a problem set; every
# lesson and both problem sets ran so when the staff code was written (15 of 15, 820 s here)
SAMPLE = ("02_kv_cache_and_paging", "06_reproducing_the_paper", "10_fair_memory")
SAMPLE += ("14_fairness_across_replicas", "01_bounds_and_proofs")


@pytest.mark.slow
@pytest.mark.parametrize(
    "path", [p for p in LESSONS + PROBLEMS if p.stem in SAMPLE], ids=lambda p: p.stem
)
def test_every_lesson_runs_on_a_fresh_edition_in_its_own_week(path, edition, tmp_path, monkeypatch):
    run_on_a_fresh_edition(path, edition, tmp_path, monkeypatch)
