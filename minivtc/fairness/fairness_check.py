"""Fairness checked while the engine runs: Lemma 4.3, or fair preemption's bound, asserted
after every step and whenever a client joins the queue (the engine's check_fairness).

Owns `FairnessCheck`, an observer: it reads a scheduler's accounts (counters, waiting queues,
weights, the charges made) and never changes them, so a run with the check makes exactly the
decisions of a run without it. For the VTC family it asserts

- with full reservation (the course's condition for Lemma 4.3's proof, not the paper's model:
  the paper admits a request if it fits in memory, lessons/artifact_deviations.md), that the
  waiting counters stay within the U the cost h states (`cost.spread_bound`): for the linear
  h, U = max(w_p L_input, w_q M) when w_p <= w_q (Lemma 4.3), and w_q M + (w_p - w_q)
  min(L_input, M) when w_p > w_q (ours: `cost.fairness_bound`, where the proof is); the
  profiled h's from its largest charge for one token (ours); Theorem 4.4 then bounds two
  backlogged clients' service gap by 2U;
- with blocks on demand and the fair victim, that they stay within max(gap, the largest
  dispatch charge) + the largest one-step charge, as the run stands (`cost.preemptive_bound`,
  where its proof is), and the proof's induction step: a client that ran in the last step is
  at most max(gap, the largest dispatch charge) + its charge in that step above the smallest
  waiting counter.

Counters are compared in counter units: divided by the smallest weight below 1. For another
policy it reports the bound the policy states (`Ledger.gap_bound`, e.g. DRR's 2(U + Q)).
What no stated bound covers is refused with its reason: a policy that states none, a cost h
that states none, a length predictor's refunds, the artifact's peak check, blocks on demand
with the latest victim. `BacklogWatch` (`sim/backlog.py`) measures the gap itself. Plain Python: no
tensors. Lessons 5 and 11.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from minivtc.fairness.cost import spread_bound, weights_of
from minivtc.fairness.scheduler import Scheduler
from minivtc.requests.request import Request

__all__ = ["FairnessCheck"]

SLACK = 1e-6  # float sums of charges: a spread may exceed the bound by rounding only


class FairnessCheck:
    """`max_input`: L_input, the longest prompt that can be admitted; `pool_tokens`: M;
    `max_running`: B, the most requests one client can run at once (fair preemption);
    `reservation` and `preempt_gap` (the fair victim's; None: no fair victim): the engine's.
    Refuses what no stated bound covers."""

    def __init__(
        self,
        scheduler: Scheduler,
        max_input: int,
        pool_tokens: int,
        max_running: int,
        reservation: str,
        preempt_gap: float | None,
    ) -> None:
        refuse_unbounded(reservation, preempt_gap)
        self.scheduler, self.preempt_gap = scheduler, preempt_gap
        w_p, w_q = weights_of(scheduler.cost)
        u = spread_bound(scheduler.cost, max_input, pool_tokens)
        if u is None and (preempt_gap is None or not scheduler.ledger.keeps_counters):
            raise ValueError(
                f"check_fairness: no bound is stated for the cost h {scheduler.cost!r}: Lemma "
                "4.3's U is proved for the linear h and the profiled one (`cost.spread_bound`)"
            )
        self.u = 0.0 if u is None else u  # (the preemptive bound is the run's own charges)
        self.counted = scheduler.ledger.keeps_counters  # the VTC family: its spread is checked
        self.bound = 2 * self.u  # (for another policy: what it states, `gap_bound`)
        self.dispatch_charge = 0.0  # the largest dispatch charge so far, in counter units
        self.step_charge = 0.0  # the largest one-step charge of a client so far
        self.step_gain: dict[str, float] = {}  # client -> its charge in the last step
        if not self.counted:
            if scheduler.ledger.gap_bound(self.u) is None:
                raise ValueError(
                    "check_fairness needs a policy that states a bound (the VTC family, DRR), "
                    f"not {scheduler.name}"
                )
            return
        if scheduler.ledger.refunds():
            raise ValueError(
                "check_fairness: no bound is stated with a length predictor: a prediction above "
                "the length reached is refunded, lowering a counter after others were lifted to "
                "it, and Lemma 4.3's U can fail (Lesson 8)"
            )
        weights = scheduler.ledger.client_weights().values()
        self.scale = 1.0 / min(min(weights, default=1.0), 1.0)
        self.bound = self.u * self.scale  # Lemma 4.3's U in counter units
        if preempt_gap is not None:  # U_P with B = max_running
            self.bound = (
                max(preempt_gap, w_p * max_input * self.scale) + w_q * max_running * self.scale
            )

    def gap_bound(self) -> float:
        """The service-gap bound this run guarantees two backlogged clients: 2U (Theorem
        4.4); with fair preemption 2 (max(gap, w_p L_input) + w_q b) with the run's own
        largest dispatch and one-step charges; another policy's stated bound."""
        if not self.counted:
            return self.scheduler.ledger.gap_bound(self.u) or 0.0
        if self.preempt_gap is None:
            return 2 * self.bound
        return 2 * (max(self.preempt_gap, self.dispatch_charge) + self.step_charge)

    def dispatched(self, request: Request) -> None:
        """`request`'s prompt was just charged: the largest dispatch charge so far (a request
        back from a preemption was charged at its first dispatch only)."""
        if self.counted and not request.num_preemptions:
            charge = self.scheduler.ledger.dispatch_charge(request)
            self.dispatch_charge = max(self.dispatch_charge, charge)

    @contextmanager
    def step(self, batch: list[Request]) -> Iterator[None]:
        """Around the step's decode charges: each client's charge in the step."""
        if not self.counted or self.preempt_gap is None:
            yield
            return
        before = {r.client_id: self.counter(r.client_id) for r in batch}
        yield
        self.step_gain = {c: self.counter(c) - n for c, n in before.items()}
        self.step_charge = max([self.step_charge, *self.step_gain.values()])

    def check(self) -> None:
        """After a step: the spread, and with fair preemption the induction step."""
        least = self.check_spread()
        if least is None or self.preempt_gap is None:
            return
        lead = max(self.preempt_gap, self.dispatch_charge)
        for client, gain in self.step_gain.items():
            ahead = self.counter(client) - least
            assert ahead <= lead + gain + SLACK, (
                f"fair preemption violated: {client!r} ran {ahead:.1f} ahead of the smallest "
                f"waiting counter, more than max(gap, w_p L_input) + its step {lead + gain:.1f}"
            )

    def check_spread(self) -> float | None:
        """The waiting counters' spread is within the bound (also called when a client joins
        the queue: a lift too low would widen it between steps, and the same step's
        dispatches could close it again, unseen). Returns the smallest waiting counter (None:
        not the VTC family, or Q empty)."""
        waiting = self.scheduler.ledger.waiting_counters()
        if not waiting:
            return None
        least, spread = min(waiting), max(waiting) - min(waiting)
        if self.preempt_gap is None:
            assert spread <= self.bound + SLACK, (
                f"Lemma 4.3 violated: waiting counters spread {spread:.1f} > U = {self.bound:.1f}"
            )
            return least
        lead = max(self.preempt_gap, self.dispatch_charge)
        assert spread <= lead + self.step_charge + SLACK, (
            f"the preemptive bound violated: waiting counters spread {spread:.1f} > max(gap, "
            f"w_p L_input) + w_q b = {lead:.1f} + {self.step_charge:.1f}"
        )
        return least

    def counter(self, client: str) -> float:
        counter = self.scheduler.ledger.counter(client)
        assert counter is not None, f"{client!r} ran without a counter"
        return counter


def refuse_unbounded(reservation: str, preempt_gap: float | None) -> None:
    """No bound is stated for the artifact's peak check or for the latest victim."""
    if reservation == "none" and preempt_gap is None:
        raise ValueError(
            "check_fairness: no bound is stated for blocks on demand with the latest victim "
            "(preempting the most recent request can break Lemma 4.3's); use victim='fair'"
        )
    if reservation == "peak":
        raise ValueError(
            "check_fairness: no bound is stated for the artifact's peak check (requests that "
            "finish early let the others grow past M, and Lemma 4.3's U can fail); use "
            "reservation='full' (the condition Lemma 4.3's proof needs) or 'none' with "
            "victim='fair'"
        )
