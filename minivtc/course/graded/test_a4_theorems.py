"""Assignment a4, graded (3 of 3): the paper's theorems on workloads (Lessons 5 and 7).

Random workloads served by the course's bench (`testbed.py`: the engine's admission and
charging, without the engine): Lemma 4.3 after every step (the package's FairnessCheck, as the
engine's check_fairness), Theorems 4.4 and 4.9 on every interval, Theorem 4.8's construction
and the LCF counterexample. A broken property names the mechanisms that could break it; each
mechanism's exact counters are `test_a4_pick.py`'s and `test_a4_charges.py`'s."""

from __future__ import annotations

from hypothesis import given, settings

from minivtc.course.graded.driver import (
    W_Q,
    Arrival,
    bound_u,
    first_over,
    max_gap,
    random_arrivals,
    workloads,
)
from minivtc.course.graded.testbed import idle_then_return, serve
from minivtc.fairness.policies import make_scheduler
from minivtc.fairness.scheduler import FCFS
from minivtc.fairness.vtc import VTC

__all__ = ["PROPERTY", "replay"]

# Derandomized: the same submission gets the same examples, so the same points, on every run.
# One failure reported, the simplest: its own message is the student's, not "Hypothesis found
# 3 distinct failures".
PROPERTY = settings(deadline=None, derandomize=True, database=None, report_multiple_bugs=False)


SUSPECTS = (
    "could be: the lift (a client joining below the smallest waiting counter, or above it), "
    "the pick (not the smallest counter, ties, or a request other than the earliest), the "
    "prompt charge (missing, late or charged twice) or the output charge"
)


def replay(policy: VTC, w: dict, **how):
    """`serve` on the workload `w`; a broken property is reported with its reproduction (the
    workload and its seed; the step is `serve`'s) and the mechanisms that could break it."""
    try:
        return serve(policy, random_arrivals(w), w["kv_tokens"], fairness=True, **how)
    except AssertionError as e:
        first = str(e).splitlines()[0]
        raise AssertionError(f"{first}; replay: random_arrivals({w}); {SUSPECTS}") from e


@settings(PROPERTY, max_examples=60)
@given(workloads)
def test_lemma_4_3_and_theorems_4_4_and_4_9(w):
    """Lemma 4.3 after every step, Theorems 4.4 and 4.9 on every interval, on random workloads."""
    arrivals = random_arrivals(w)
    u = bound_u(max(a.prompt for a in arrivals), w["kv_tokens"])
    engine, steps, _ = replay(VTC(), w)
    clients = sorted({a.client for a in arrivals})
    for f in clients:
        for g in clients:
            if f < g:
                gap = max_gap(steps, f, g)
                assert gap <= 2 * u, (
                    f"Theorem 4.4 violated: {f} and {g} both backlogged, service gap {gap} > "
                    f"2U = {2 * u}, first at step {first_over(steps, f, g, 2 * u)}; replay: "
                    f"random_arrivals({w}); {SUSPECTS}"
                )
            # Theorem 4.9: f backlogged throughout => W_f >= W_g - 4U, for any g.
            worst, prefix, lo = 0.0, 0.0, 0.0
            for s in steps:
                if f in s.backlogged:
                    prefix += s.service.get(g, 0.0) - s.service.get(f, 0.0)
                    worst, lo = max(worst, prefix - lo), min(lo, prefix)
                else:
                    prefix = lo = 0.0
            assert worst <= 4 * u, (
                f"Theorem 4.9 violated: {f} backlogged got {worst} less than {g} > 4U = {4 * u}; "
                f"replay: random_arrivals({w}); {SUSPECTS}"
            )


def test_theorem_4_8_the_bound_is_tight_within_2x():
    """Theorem 4.8: a gap of about w_q M is unavoidable, and VTC's stays within 2U. F floods first
    and fills the pool; G arrives a moment later and cannot preempt. Any work-conserving,
    non-preemptive policy (VTC and FCFS alike) shows a gap ~ w_q * M."""
    m = 100
    arrivals = [Arrival(0.0, "F", 1, m - 1)] + [
        Arrival(0.5, c, 1, m - 1) for c in "FG" for _ in range(3)
    ]
    u = bound_u(1, m)
    for policy in (VTC(), FCFS()):
        _, steps, _ = serve(policy, arrivals, kv_tokens=m)
        gap = max_gap(steps, "F", "G")
        assert W_Q * (m - 2) <= gap, (
            f"{policy.name}: gap {gap} below w_q (M - 2) = {W_Q * (m - 2)} on Theorem 4.8's "
            "construction, where no work-conserving policy can do better: could be a charge "
            "counted twice or the pick serving G before it arrived"
        )
        if policy.ledger.keeps_counters:
            # so VTC's 2U is within 2x of what any such policy must allow
            assert gap <= 2 * u, (
                f"VTC's service gap {gap} > 2U = {2 * u} on Theorem 4.8's construction, first "
                f"at step {first_over(steps, 'F', 'G', 2 * u)}: could be the lift (G joining "
                "below F) or the pick"
            )


def test_lcf_lets_a_returning_client_monopolise_and_vtc_does_not():
    """A client back from idle does not monopolise the server (LCF, without the lift, lets it)."""
    u = bound_u(8, 64)
    _, lcf_steps, _ = idle_then_return(make_scheduler("lcf"))
    _, vtc_steps, _ = idle_then_return(make_scheduler("vtc"))
    # B's stale low counter takes every dispatch
    assert max_gap(lcf_steps, "A", "B") > 5 * u, (
        "the LCF baseline (VTC without the lift) should let B monopolise here: does "
        "VTC(lift=False) still lift? (the lift belongs in lift_counter, called only with the lift)"
    )
    gap = max_gap(vtc_steps, "A", "B")
    assert gap <= 2 * u, (
        f"B back from idle at t = 300: service gap {gap} > 2U = {2 * u}, first at step "
        f"{first_over(vtc_steps, 'A', 'B', 2 * u)}: B kept a stale low counter (the lift: a "
        "client joining Q is raised to the smallest waiting counter)"
    )
