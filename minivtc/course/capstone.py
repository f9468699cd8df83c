"""The capstone (assignment a6): a fair policy of your own, through the scheduler interface.

Write `FairPolicy`, a `Scheduler` (`minivtc/fairness/scheduler.py` lists the calls the engine
makes: `add`, `peek`, `dispatch`, `on_decode`, `on_finish`, `remove`, `requeue`, `waiting`;
`check_invariants` is yours to fill in or leave). Any design is welcome: a counter per client
as VTC keeps, credit handed out in turns, virtual finish times, something of your own. It
must be fair in the paper's sense, and you must say how fair:

- `gap_bound(u)` returns your bound: the most service (w_p per prompt token, w_q per output
  token) by which one of two clients backlogged over an interval may lead the other, given
  Lemma 4.3's U of the run (max(w_p L_input, w_q M) for w_p <= w_q: `cost.fairness_bound`);
- `BOUND` states it in words, with the argument for it (a few sentences, as a proof sketch:
  the instructor reads it). VTC's is Theorem 4.4's 2U; yours may be larger.

What the grader checks (`graded/test_a6_fair.py`), on random workloads and on adversarial ones
(a client that floods first, one with huge prompts beside one with tiny ones, one that comes
and goes, one that leaves the queue at every dispatch), served by the course's bench
(`graded/testbed.py`), with no other assignment needed:

- work conservation: it never leaves the server idle while a request waits;
- equal shares: clients backlogged throughout, with equal weights, get equal service whatever
  the sizes of their requests (prompt-heavy or output-heavy, small or large), however early
  their requests stop (end-of-sequence long before max_tokens), and whatever the prices of
  prompt and output tokens (`self.cost`: w_p and w_q are not always 1 and 2);
- a bounded gap: the service gap of two backlogged clients stays within your stated bound;
  a bound looser than 4U (twice Theorem 4.4's) is refused, and the bound must be one your
  policy comes near: on the adversarial workloads its worst gap reaches at least a third of
  it (`course test a6` and the grader report the slack, your bound over that gap, whether
  the test passes or fails);
- what a client that always waits keeps: over any interval in which it is backlogged
  throughout, it receives at least what any other client receives, less 4U (Theorem 4.9's
  bound for VTC), even beside clients that come and go, whom the backlogged gap never watches;
- no starvation: a client back from a long idle stretch is served soon, and does not then take
  the server over (the LCF counterexample of Lesson 5);
- on the paper's workloads (Section 5, with the A10G's step times), side by side with VTC and
  FCFS: a worst backlogged gap within 25% of VTC's and under a tenth of FCFS's, and VTC's
  throughput (within 2%).

Your own policy, through the `Scheduler` interface: the package's policies (VTC and its
family, DRR, the official artifact's) are out of reach while the capstone is graded, and a
capstone that imports one (or `make_scheduler`, or imports by name at run time) is refused,
by name, by `minivtc course test a6` as by the grader.

Typing VTC (Algorithm 2) from the paper is allowed, and graded as any design is: the checks
above are what every fair policy must pass, so a VTC typed correctly passes them. What the
capstone asks beyond VTC is the argument, which no test can grade: `BOUND` argues the bound for
your code (where your lift and your charges give Lemma 4.3's step, or what replaces it in your
design) and what a client that always waits keeps. The instructor grades it; a statement
copied from the paper that says nothing of your code earns none of its marks.

The instructor's answer is Deficit Round Robin as Appendix C.2 adapts it (`fairness/drr.py`), one
answer among many; the student edition has this statement and an empty `FairPolicy`.
"""

from __future__ import annotations

from minivtc.fairness.cost import PAPER_COST, Cost
from minivtc.fairness.drr import DRR

__all__ = ["FairPolicy"]

QUANTUM = 64.0  # a turn's credit: within U on every graded workload, so 2(U + Q) <= 4U


class FairPolicy(DRR):
    """Deficit Round Robin (`fairness/drr.py`) with a quantum of 64."""

    BOUND = (
        "Two clients backlogged over an interval receive service within 2(U + Q) of each other "
        "(Q the quantum). Over whole rounds each receives Q per round; within a round one can "
        "be ahead by its quantum, one dispatch's overshoot (at most w_p L_input) and the decode "
        "charges its running requests build up while the other waits for memory (at most "
        "w_q M); the same holds at both ends of an interval."
    )

    def __init__(self, cost: Cost = PAPER_COST) -> None:
        super().__init__(QUANTUM, cost)
        self.name = "fair"
