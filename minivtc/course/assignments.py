"""The assignments: what each asks a student to write, and the tests that grade it.

Each names functions of the package by file and qualified name. The student edition replaces
their bodies with `raise NotImplementedError`; grading an assignment runs its graded tests
(`graded/test_<key>.py`) on the reference package with just those functions taken from the
student's edition, so an assignment is graded on its own, whatever the student did elsewhere.
The capstone is a file the student writes whole (`own_file`); its instructor's answer
(`answer`, Deficit Round Robin) is not in the edition.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Assignment:
    key: str  # graded/test_<key>.py holds its tests
    title: str
    functions: tuple[tuple[str, str], ...]  # (file under minivtc/, qualified name)
    max_points: int
    hours: str  # how long it takes a student, roughly
    teaches: str
    # The student writes this file whole (the capstone): the edition ships its docstring, the
    # task, with an empty class; grading takes the student's file as it is.
    own_file: str | None = None
    # The instructor's answer to an own-file assignment, kept outside the edition: the
    # functions the grader's own check mutates and edits (`mutate.py`, `wrong.py`).
    answer: tuple[tuple[str, str], ...] = ()

    @property
    def reference_functions(self) -> tuple[tuple[str, str], ...]:
        """What the grader's check mutates: the functions asked for, or the answer's."""
        return self.functions + self.answer


ASSIGNMENTS = (
    Assignment(
        "a1_llama",
        "The Llama-2 pieces: RMSNorm, rotary positions, grouped-query attention",
        (
            ("model/llama.py", "RMSNorm.forward"),
            ("model/llama.py", "rotary_cos_sin"),
            ("model/llama.py", "apply_rotary"),
            ("model/llama.py", "causal_attention"),
        ),
        20,
        "2-3",
        "Lesson 1; graded against transformers' Llama, piece by piece and whole",
    ),
    Assignment(
        "a2_blocks",
        "The block allocator and the slot mapping",
        (
            ("engine/kv_pool.py", "BlockAllocator.allocate"),
            ("engine/kv_pool.py", "BlockAllocator.grow"),
            ("engine/kv_pool.py", "BlockAllocator.free"),
            ("engine/kv_pool.py", "BlockAllocator.slots"),
        ),
        15,
        "1-2",
        "Lesson 2; graded by the allocator's invariants and paged == dense attention",
    ),
    Assignment(
        "a3_batching",
        "Admission and one continuous-batching step",
        (("engine/admission.py", "FullReservation.reserve"), ("engine/engine.py", "Engine.step")),
        15,
        "2",
        "Lesson 3; graded through the engine with a stand-in runner and a real model",
    ),
    Assignment(
        "a4_vtc",
        "The Virtual Token Counter: pick, lift, charge, refund",
        (
            ("fairness/vtc.py", "VTC.peek"),
            ("fairness/vtc.py", "VTC.dispatch"),
            ("fairness/vtc.py", "VTC.lift_counter"),
            ("fairness/vtc.py", "VTC.charge_outputs"),
            ("fairness/vtc.py", "VTC.on_finish"),
        ),
        30,
        "3-4",
        "Lesson 5; graded by Lemma 4.3, Theorem 4.4, the LCF counterexample and "
        "Theorem 4.8's construction",
    ),
    Assignment(
        "a5_metric",
        "The paper's metric: Table 2's Max / Avg / Var Diff",
        (("harness/metrics.py", "table_metrics"),),
        20,
        "1-2",
        "Lessons 4 and 6; graded against the artifact's measured A10G runs",
    ),
    Assignment(
        "a6_fair",
        "Capstone: a fair policy of your own, with a written statement of its bound",
        (),
        30,
        "4-6",
        "Lessons 4, 5 and 9; graded by what any fair policy must do (work conservation, equal "
        "shares, a bounded backlogged gap, no starvation) and on the paper's workloads against "
        "VTC and FCFS",
        own_file="course/capstone.py",
        answer=(
            ("fairness/drr.py", "DRR.add"),
            ("fairness/drr.py", "DRR.peek"),
            ("fairness/drr.py", "DRR.dispatch"),
            ("fairness/drr.py", "DRR.on_decode"),
        ),
    ),
)
