"""The assignments: what each asks a student to write, and the tests that grade it.

Each names functions of the package by file and qualified name. The student edition replaces
their bodies with `raise NotImplementedError`; grading an assignment runs its graded tests
(`test_files`: `graded/test_<key>.py`, or the files it names) on the reference package with
just those functions taken from the student's edition, so an assignment is graded on its own,
whatever the student did elsewhere.
The capstone and the design assignments (d1, d2) are files the student writes whole
(`own_file`); their instructors' answers (`answer`: DRR, `course/instructor/`) are not in it.
"""

from __future__ import annotations

from dataclasses import dataclass

from minivtc.course.rubrics import A3_RUBRIC, A4_RUBRIC, A4B_RUBRIC, A6_RUBRIC, Line, line

__all__ = ["A3_RUBRIC", "A4B_RUBRIC", "A4_RUBRIC", "ASSIGNMENTS", "Assignment"]


@dataclass(frozen=True)
class Assignment:
    key: str  # graded/test_<key>.py holds its tests, unless `graded` names its files
    title: str
    functions: tuple[tuple[str, str], ...]  # (file under minivtc/, qualified name)
    rubric: tuple[Line, ...]  # its points sum to max_points
    # A student's hours, estimated from counts measured by taking the course once on the
    # student edition: the words read in the assignment's files at 200 a minute plus the lines
    # written at 4 minutes each, rounded up to a quarter hour (lessons/SYLLABUS.md, "How these
    # hours were found", gives the counts; for the functions asked for since, the lines are
    # their reference's, not measured)
    hours: float
    teaches: str
    # The student writes this file whole (the capstone): the edition ships its docstring, the
    # task, with an empty class; grading takes the student's file as it is.
    own_file: str | None = None
    # The instructor's answer to an own-file assignment, kept outside the edition: the
    # functions the grader's own check mutates and edits (`mutate.py`, `wrong.py`).
    answer: tuple[tuple[str, str], ...] = ()
    # Its graded tests' files in graded/, where one file would be too long (a4's, by mechanism)
    graded: tuple[str, ...] = ()

    @property
    def test_files(self) -> tuple[str, ...]:
        """Its graded tests' files, under minivtc/: what grading runs and the rubric names."""
        return tuple(f"course/graded/{name}" for name in self.graded or (f"test_{self.key}.py",))

    @property
    def max_points(self) -> int:
        return sum(line.points for line in self.rubric)

    def line_of(self, test: str) -> Line | None:
        """The rubric line of `test` (pytest's name: its parameters are ignored)."""
        base = test.partition("[")[0]
        return next((line for line in self.rubric if base in line.tests), None)

    @property
    def reference_functions(self) -> tuple[tuple[str, str], ...]:
        """What the grader's check mutates: the functions asked for, or the answer's."""
        return self.functions + self.answer


# Algorithm 2 (Lesson 5): the counter structure that picks the smallest waiting counter, and
# VTC's pick, lift and charges (each step's, `on_decode`). Its admission round is a3's.
A4_FUNCTIONS = (
    ("fairness/least_counter.py", "LeastCounter.push"),
    ("fairness/least_counter.py", "LeastCounter.compact"),
    ("fairness/least_counter.py", "LeastCounter.least"),
    ("fairness/least_counter.py", "LeastCounter.entry"),
    ("fairness/least_counter.py", "LeastCounter.is_live"),
    ("fairness/vtc.py", "VTC.peek"),
    ("fairness/vtc.py", "VTC.dispatch"),
    ("fairness/vtc.py", "VTC.on_finish"),
    ("fairness/vtc.py", "VTC.join"),
    ("fairness/vtc.py", "VTC.lift_counter"),
    ("fairness/vtc.py", "VTC.join_floor"),
    ("fairness/vtc.py", "VTC.lift_floor"),
    ("fairness/vtc.py", "VTC.charge"),
    ("fairness/vtc.py", "VTC.charge_outputs"),
    ("fairness/vtc.py", "VTC.on_decode"),
)
# a4's functions and a3's step and make_room, extended (Lessons 8-13: make_room's displacement
# loop), and fair memory's own mechanisms (Lessons 10-11): the fair victim and fair preemption's
# lift.
A4B_FUNCTIONS = (
    *A4_FUNCTIONS,
    ("engine/engine.py", "Engine.step"),
    ("engine/engine.py", "Engine.make_room"),
    ("engine/preemption.py", "Fair.choose"),
    ("engine/preemption.py", "Fair.displace"),
    ("fairness/fair_lift.py", "FairLift.ran"),
    ("fairness/fair_lift.py", "FairLift.floor"),
)

# The design assignments (d1, d2): graded by properties on hidden workloads (design_bench.py)
D1_RUBRIC = (
    line(
        "a Scheduler with a stated bound, within 4U and near its worst gap",
        "test_it_is_a_scheduler_and_states_its_bound",
        "test_the_stated_bound_is_reached_on_an_adversarial_workload",
        lesson=5,
    ),
    line(
        "the quota: never exceeded, a request that never fits refused, room back on preemption",
        "test_no_client_ever_holds_more_than_its_quota",
        "test_a_request_larger_than_its_quota_is_refused",
        "test_a_preempted_request_gives_its_room_back_and_an_aborted_one_is_forgotten",
        lesson=10,
    ),
    line(
        "nothing held back that has room in its quota",
        "test_nothing_is_held_back_that_has_room",
        lesson=5,
    ),
    line(
        "equal shares for clients without a quota, beside a capped one",
        "test_clients_without_a_quota_share_equally_beside_a_capped_one",
        lesson=5,
    ),
    line(
        "a bounded gap on hidden random and adversarial workloads",
        "test_the_gap_stays_within_your_bound_on_random_workloads",
        "test_the_gap_stays_within_your_bound_on_adversarial_workloads",
        lesson=5,
    ),
)
D2_RUBRIC = (
    line(
        "a Scheduler with both bounds stated",
        "test_it_is_a_scheduler_and_states_its_bounds",
        lesson=8,
    ),
    line(
        "work conservation, each user's requests in order, requeued and removed ones too",
        "test_it_never_idles_while_a_request_waits",
        "test_a_preempted_request_waits_first_again_and_an_aborted_one_is_forgotten",
        lesson=8,
    ),
    line(
        "tenants share equally whatever their number of users",
        "test_tenants_share_equally_whatever_their_number_of_users",
        lesson=8,
    ),
    line(
        "users share their tenant's service equally",
        "test_users_of_a_tenant_share_equally_whatever_their_request_sizes",
        lesson=8,
    ),
    line(
        "bounded gaps, tenants and users, on hidden random and adversarial workloads",
        "test_the_gaps_stay_within_your_bounds_on_random_workloads",
        "test_the_gaps_stay_within_your_bounds_on_adversarial_workloads",
        lesson=8,
    ),
)

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
        (
            line("RMSNorm", "test_rmsnorm_matches_transformers", lesson=1),
            line("rotary positions", "test_rotary_positions_match_transformers", lesson=1),
            line(
                "grouped-query causal attention",
                "test_causal_attention_with_grouped_queries",
                lesson=1,
            ),
            line(
                "the pieces together: the whole model",
                "test_whole_model_logits_match_transformers",
                lesson=1,
            ),
        ),
        1.75,
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
        (
            line(
                "allocate, grow, free and slots, by hand",
                "test_allocate_grow_free_and_slots",
                lesson=2,
            ),
            line(
                "the allocator's invariants under random operations",
                "test_random_operations_keep_the_invariants",
                lesson=2,
            ),
            line(
                "the slot mapping in use: paged attention gives dense attention's tokens",
                "test_paged_engine_gives_the_tokens_of_dense_attention",
                lesson=2,
            ),
        ),
        1.5,
        "Lesson 2; graded by the allocator's invariants and paged == dense attention",
    ),
    Assignment(
        "a3_batching",
        "Admission and one continuous-batching step",
        (
            ("fairness/scheduler.py", "admission_round"),
            ("engine/admission.py", "FullReservation.reserve"),
            ("engine/engine.py", "Engine.make_room"),
            ("engine/engine.py", "Engine.step"),
        ),
        A3_RUBRIC,
        2.25,
        "Lesson 3; graded on a scheduler alone (the admission round) and through the engine with "
        "a stand-in runner and a real model",
    ),
    Assignment(
        "a4_vtc",
        "The Virtual Token Counter: the counter structure, pick, lift, charge",
        A4_FUNCTIONS,
        A4_RUBRIC,
        3.75,
        "Lessons 5 (the counter structure, the pick, the lift, the charges) and 7 (Theorem "
        "4.9); graded by exact counters for each mechanism, Lemma 4.3, Theorems 4.4, 4.8 "
        "and 4.9 and the LCF counterexample",
        graded=("test_a4_charges.py", "test_a4_pick.py", "test_a4_theorems.py"),
    ),
    Assignment(
        "a4b_variants",
        "VTC extended: the profiled cost, prediction and refund, weights, blocks on demand, "
        "the fair victim and fair preemption's lift, cached tokens",
        A4B_FUNCTIONS,
        A4B_RUBRIC,
        2.5,
        "Lessons 8 (the profiled h, prediction and refunds, weights), 10 (blocks on demand, "
        "readmission, the fair victim), 11 (fair preemption's lift) and 13 (w_c, cached prompt "
        "tokens), on a4's VTC and a3's step; graded by exact counters for each mechanism and "
        "weighted VTC's bound and shares",
        graded=("test_a4b_variants.py", "test_a4b_memory.py"),
    ),
    Assignment(
        "a5_metric",
        "The paper's metric: Table 2's Max / Avg / Var Diff",
        (("sim/metrics.py", "table_metrics"),),
        (
            line("Table 2's rows, from the artifact's runs", "test_table_2_rows", lesson=4),
            line(
                "no difference for clients served alike",
                "test_clients_served_alike_and_as_demanded_have_no_difference",
                lesson=4,
            ),
            line(
                "throughput over the served span",
                "test_without_a_total_time_throughput_is_over_the_served_span",
                lesson=4,
            ),
            line(
                "a starved client's difference, capped by its demand",
                "test_a_starved_client_counts_up_to_its_demand",
                lesson=4,
            ),
        ),
        1.0,
        "Lesson 4 (Lesson 6 applies it to the paper's runs); graded against the artifact's "
        "measured A10G runs",
    ),
    Assignment(
        "a6_fair",
        "Capstone: a fair policy of your own, with a written statement of its bound",
        (),
        A6_RUBRIC,
        4.0,
        "Lessons 4, 5, 8, 10 and 11; graded by what any fair policy must do (work conservation, "
        "equal shares, a bounded backlogged gap, no starvation) and on the paper's workloads "
        "against VTC and FCFS",
        own_file="course/capstone.py",
        answer=(
            ("fairness/drr.py", "DRR.add"),
            ("fairness/drr.py", "DRR.peek"),
            ("fairness/drr.py", "DRR.dispatch"),
            ("fairness/drr.py", "DRR.on_decode"),
        ),
    ),
    Assignment(
        "d1_quota",
        "Design: fairness under per-client quotas of the memory, with its bound",
        (),
        D1_RUBRIC,
        3.0,
        "Lessons 3 (full reservation) and 5 (Algorithm 2, Lemma 4.3, the lift); graded by the "
        "quota, work conservation and the gap between clients without a quota, on hidden workloads",
        own_file="course/design/quota.py",
        answer=tuple(
            ("course/instructor/quota_answer.py", f"QuotaVTC.{m}")
            for m in ("add", "peek", "dispatch", "on_decode", "on_finish", "remove", "requeue")
            + ("update", "has_room", "floor")
        ),
    ),
    Assignment(
        "d2_tenants",
        "Design: fairness between tenants and between each tenant's users, with its bounds",
        (),
        D2_RUBRIC,
        3.0,
        "Lessons 5 (Algorithm 2, Lemma 4.3, the lift) and 8 (weights, for contrast); graded by "
        "shares and gaps at both levels, on hidden workloads",
        own_file="course/design/tenants.py",
        answer=tuple(
            ("course/instructor/tenants_answer.py", q)
            for q in ("Counters.arrive", "Counters.depart", "Counters.least", "Counters.floor")
            + tuple(f"TenantVTC.{m}" for m in ("add", "peek", "dispatch", "on_decode", "remove"))
            + tuple(f"TenantVTC.{m}" for m in ("requeue", "charge", "arrive", "depart"))
        ),
    ),
)
