"""The grader tells wrong from right: every wrong solution of the catalogue loses points.

Runs `python -m minivtc.course.check --catalogue-only` (a fresh process, which forks each
graded run from itself: `course/warm.py`), each wrong solution graded on its own assignment
only, stopping at its first failed test. The mutation run (`minivtc course check-grader`) is
longer and is not run here; its numbers are in the README."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from minivtc.course import sandbox
from minivtc.course.assignments import ASSIGNMENTS
from minivtc.course.check import CHECK_LIMIT_S, answer_files, assignment, write_edition
from minivtc.course.grade import CHANNEL, How, grade_one
from minivtc.course.wrong import WRONG
from minivtc.course.wrong_policies import RETYPED_VTC

NAMED_IN_THE_ISSUE = {  # the wrong answers that once got full marks
    "a4_vtc": [
        "a lift that can lower a counter",
        "a lift to the largest waiting counter",
        "ties go to the client seen last",
        "no dispatch charge",
        "never sets last_left",
        "each client's queue served last in, first out",
        "ties go to the client with the longest queue",
        "output charges sent to the wrong client",
    ],
    "a4b_variants": [  # a4's until Lessons 8-13's mechanisms moved to a4b
        "never calls predictor.observe",
        "a charge valid only for the linear cost",
        "no cache discount",
        "the lift to Algorithm 2's floor alone, not fair preemption's",
        "Algorithm 3's refund written linear, w_q (predicted - actual), whatever h",
        "Algorithm 3's dispatch charge written linear, w_p n_p + w_q predicted, whatever h",
        "Algorithm 3's refund through lower(), stopped at the smallest waiting counter",
    ],
    "a6_fair": [
        "never charges prompts",
        "ignores decode charges",
        "charges each request's whole max_tokens at dispatch and never refunds",
        "states 4U, the loosest bound allowed, whatever the policy does",
        "FairPolicy subclasses the reference VTC (three lines)",
        "VTC typed from scratch whose lift sets the counter to the floor, so can lower it",
    ],
}


def test_the_catalogue_has_eight_wrong_solutions_per_assignment_and_the_known_ones():
    for a in ASSIGNMENTS:
        assert sum(w.key == a.key for w in WRONG) >= 8, a.key
    for key, names in NAMED_IN_THE_ISSUE.items():
        assert set(names) <= {w.what for w in WRONG if w.key == key}, key


@pytest.mark.slow
def test_every_wrong_solution_loses_points(tmp_path):
    out = tmp_path / "catalogue.json"
    command = [sys.executable, "-m", "minivtc.course.check", "--catalogue-only"]
    command += ["--jobs", str(min(4, os.cpu_count() or 1)), "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    rows = json.loads(out.read_text())["catalogue"]
    assert len(rows) == len(WRONG), done.stderr[-3000:]
    kept = [f"{r['assignment']}: {r['wrong']}" for r in rows if r["points"] >= r["max"]]
    assert not kept, f"full marks for wrong solutions: {kept}"
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


@pytest.mark.slow
def test_a_capstone_typing_vtc_from_scratch_keeps_full_marks(tmp_path):
    """Allowed (the capstone's task says what it must add: the argument); the catalogue's
    capstone with the lift that sets the counter is this one with that mistake."""
    from minivtc.course.edits import Wrong

    retyped = Wrong("a6_fair", "VTC typed from scratch", own_file=RETYPED_VTC)
    g = grade_one(assignment("a6_fair"), write_edition(retyped, tmp_path), How(CHECK_LIMIT_S))
    assert g.points == g.max_points, (g.note, g.failures)
    broken = [w.own_file for w in WRONG if w.what.startswith("VTC typed from scratch")]
    assert broken and broken != [RETYPED_VTC], "the catalogue's entry must change the lift"


@pytest.mark.slow
@pytest.mark.skipif(sandbox.why_not() is not None, reason=str(sandbox.why_not()))
@pytest.mark.parametrize("key", sorted(CHANNEL))
def test_wrong_solutions_lose_points_through_the_sandbox_and_its_channel(key, tmp_path):
    """The catalogue's check runs the instructor's code unsandboxed; graded as a student's
    (the tests outside the sandbox, the wrong functions inside it), the first wrong solution of
    each assignment whose tests call through the channel loses points too (stopped at its first
    failed test, as in the catalogue's check: losing points is the test)."""
    a = assignment(key)
    wrong = next(w for w in WRONG if w.key == key)
    whole = answer_files(a) if wrong.own_file is None else ()
    g = grade_one(a, write_edition(wrong, tmp_path), How(CHECK_LIMIT_S, first_failure=True), whole)
    assert g.points < g.max_points, (wrong.what, g)
