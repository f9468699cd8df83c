"""The rubrics: each assignment's points by mechanism, a line per mechanism.

Owns `Line` (a mechanism, its points, the graded tests that check it, the lesson that teaches
it) and the longer rubrics (a3's, a4's, a4b's, a6's), which `assignments.py` names; the shorter
ones are written beside their assignment there.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["A3_RUBRIC", "A4B_RUBRIC", "A4_RUBRIC", "A6_RUBRIC", "Line", "line", "rubric_table"]


@dataclass(frozen=True)
class Line:
    """One line of an assignment's rubric: a mechanism, its points, the graded tests
    (functions of the assignment's `test_files`) that check it, and the lesson that teaches it.
    The points are all lost when any of those tests fails: a mechanism is understood, or not."""

    mechanism: str
    points: int
    tests: tuple[str, ...]
    lesson: int | None = None  # due no earlier than its week (tests/test_syllabus_weeks.py)


def line(mechanism: str, *tests: str, points: int = 5, lesson: int | None = None) -> Line:
    return Line(mechanism, points, tests, lesson)


# Lesson 3's admission and step, each a mechanism: Algorithm 2's round (peek, place or stop,
# dispatch), full reservation within max_running, the step, and the step with the real model.
A3_RUBRIC = (
    line(
        "the admission round: peek, place or stop at the first request that does not fit (never "
        "skipping it), dispatch before the next peek",
        "test_the_admission_round_dispatches_what_fits_and_stops_at_the_first_misfit",
        "test_the_admission_round_charges_each_prompt_before_the_next_peek",
        "test_a_request_that_does_not_fit_waits_and_blocks_those_behind_it",
        lesson=3,
    ),
    line(
        "admission: full reservation (prompt + max_tokens, or nothing), make_room within "
        "max_running",
        "test_full_reservation_reserves_prompt_plus_max_tokens_or_nothing",
        "test_the_batch_holds_at_most_max_running_and_a_request_over_it_reserves_nothing",
        lesson=3,
    ),
    line(
        "the step: admit, run, append, charge, retire, check",
        "test_each_step_charges_its_tokens_to_the_clients",
        "test_a_step_ends_by_checking_the_invariants",
        "test_one_step_admits_runs_appends_and_retires",
        lesson=3,
    ),
    line(
        "continuous batching with the real model",
        "test_continuous_batching_gives_each_request_its_tokens_alone",
        lesson=3,
    ),
)
# VTC's three details (charge at dispatch, never skip, the lift) as Lesson 5 teaches them, and the
# theorems (Lessons 5 and 7): each a mechanism. A wrong one costs 5 of 25 points, whichever test
# sees it. What the package adds to Algorithm 2 later in the course is a4b's.
A4_RUBRIC = (
    line(
        "the pick: the smallest counter (the counter structure loses no waiting client), ties "
        "to the client seen first (whenever it joined Q), FIFO within a client",
        "test_ties_go_to_the_client_seen_first",
        "test_each_client_s_requests_go_in_arrival_order",
        "test_ties_go_to_the_client_seen_first_even_when_it_joins_the_queue_last",
        "test_a_waiting_client_is_never_lost_however_often_others_join_and_are_aborted",
        lesson=5,
    ),
    line(
        "the lift, both cases (Q holds someone; Q empty)",
        "test_the_lift_never_lowers_a_counter_and_lifts_to_the_smallest_waiting",
        "test_a_client_joining_an_empty_queue_is_lifted_to_the_last_to_leave",
        lesson=5,
    ),
    line(
        "the prompt charge at dispatch: h(n_p, 0), at once",
        "test_dispatch_charges_the_prompt_at_once",
        lesson=5,
    ),
    line(
        "the output charge: each step's tokens (on_decode), each to its own client, once",
        "test_each_output_token_is_charged_to_its_own_client",
        lesson=5,
    ),
    line(
        "the theorems on random and adversarial workloads",
        "test_lemma_4_3_and_theorems_4_4_and_4_9",
        "test_theorem_4_8_the_bound_is_tight_within_2x",
        "test_lcf_lets_a_returning_client_monopolise_and_vtc_does_not",
        lesson=7,  # Theorem 4.9 (Lesson 7); Lemma 4.3, Theorems 4.4 and 4.8, LCF: Lesson 5
    ),
)
# a4's VTC and a3's step, extended as Lessons 8, 10, 11 and 13 teach: each extension a line.
A4B_RUBRIC = (
    line(
        "the profiled h: the prompt and every output token priced by any cost",
        "test_dispatch_charges_the_prompt_at_once_under_the_profiled_cost",
        "test_output_charges_follow_any_cost_the_profiled_one_too",
        lesson=8,
    ),
    line(
        "length prediction and its refund (Algorithm 3)",
        "test_the_predictor_learns_each_finished_request_and_no_aborted_one",
        "test_an_over_predicted_length_is_refunded",
        "test_a_refund_may_take_a_counter_below_the_waiting_ones",
        "test_a_refunded_client_is_picked_by_its_new_counter",
        "test_a_request_costs_h_in_the_end_whatever_the_cost_and_the_prediction",
        lesson=8,
    ),
    line(
        "weights: every charge divided by the client's weight",
        "test_every_charge_is_divided_by_the_client_s_weight",
        "test_weighted_vtc_follows_weights_within_the_bound",
        "test_weighted_vtc_shares_are_proportional_when_all_are_backlogged",
        lesson=8,
    ),
    line(
        "fair memory (Lesson 10): a step grows the blocks it writes; make_room admits within "
        "max_running, displacing the fair victim (the youngest request of the client furthest "
        "ahead) only beyond the gap; a readmitted request's prompt is not charged again",
        "test_with_blocks_on_demand_a_step_grows_the_blocks_it_writes",
        "test_the_fair_victim_is_the_youngest_request_of_the_client_furthest_ahead",
        "test_make_room_displaces_a_client_more_than_the_gap_ahead",
        "test_make_room_admits_within_max_running_and_displaces_for_a_place_in_the_batch",
        "test_a_request_back_from_a_preemption_is_not_charged_again",
        lesson=10,
    ),
    line(
        "fair preemption's lift: a client joining an empty queue lifted near every client that "
        "ran since the queue emptied",
        "test_with_fair_preemption_a_client_joining_an_empty_queue_is_lifted_near_those_that_ran",
        "test_with_fair_preemption_only_who_ran_while_the_queue_was_empty_raises_the_lift",
        lesson=11,
    ),
    line(
        "cached prompt tokens charged at w_c",
        "test_a_cached_prompt_is_charged_at_the_cached_weight",
        lesson=13,
    ),
)
# What any fair policy must do, each a line: a policy that fails one is not fair in that sense.
A6_RUBRIC = (
    line(
        "a Scheduler with a stated bound, no looser than 4U and justified by its worst gap",
        "test_it_is_a_scheduler_and_states_its_bound",
        "test_the_stated_bound_is_reached_on_an_adversarial_workload",
        lesson=5,
    ),
    line("work conservation", "test_it_never_idles_while_a_request_waits", lesson=4),
    line(
        "equal shares whatever the request sizes and however early requests stop",
        "test_backlogged_clients_share_equally_whatever_their_request_sizes",
        "test_clients_whose_requests_stop_early_still_share_equally",
        lesson=4,
    ),
    line(
        "a bounded gap on random and adversarial workloads, and an always-waiting client never "
        "out-served by more than 4U (Theorem 4.9)",
        "test_the_gap_stays_within_your_bound_on_random_workloads",
        "test_the_gap_stays_within_your_bound_on_adversarial_workloads",
        "test_a_client_that_always_waits_is_never_out_served_by_more_than_4u",
        lesson=7,
    ),
    line(
        "no starvation, no take-over, no second charge on readmission",
        "test_a_client_back_from_idle_is_served_soon_and_does_not_take_over",
        "test_a_request_back_from_a_preemption_is_not_charged_again",
        lesson=10,
    ),
    line(
        "the paper's workloads: as fair as VTC and as fast",
        "test_on_the_papers_workloads_as_fair_as_vtc_and_as_fast",
        lesson=6,
    ),
)


def rubric_table(a) -> str:
    """`a`'s rubric as a table: each mechanism, its points, the graded tests that check it."""
    rows = "\n".join(
        f"| {line.mechanism} | {line.points} | {', '.join(f'`{t}`' for t in line.tests)} |"
        for line in a.rubric
    )
    header = f"### {a.key} ({a.max_points} points)\n\n| mechanism | points | graded tests |"
    return f"{header}\n| --- | --- | --- |\n{rows}"
