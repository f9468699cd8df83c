"""Assignment d1: fairness when each client may hold at most its quota of the memory.

A tenant that pays for a share of a server is often capped: client c may hold at most
`quotas[c]` tokens of the KV pool at once (the prompt + max_tokens its running requests
reserve, as full reservation reserves them; a client not in `quotas` has no cap). The paper's
VTC knows no quotas, and this package states no bound for them: the policy and its bound are
yours. Write `QuotaPolicy(quotas, cost)`, a `Scheduler` (`minivtc/fairness/scheduler.py`: `add`,
`peek`, `dispatch`, `on_decode`, `on_finish`, `remove`, `requeue`, `waiting`), with:

- `gap_bound(u)`: the most service (w_p per prompt token, w_q per output token) by which one of
  two clients without a quota, both waiting over an interval, may lead the other, given Lemma
  4.3's U of the run (max(w_p L_input, w_q M): `cost.fairness_bound`), even beside capped
  clients; no looser than 4U;
- `BOUND`: that bound in words, with its argument (the instructor grades it: say which
  quantity you keep per client, why it stays in a range, and what a client held back by its
  quota does to the others).

What the grader checks (`graded/test_d1_quota.py`), on the course's bench (`graded/testbed.py`:
Algorithm 2's admission round, one token per running request a step), wrapped so that it
watches every call the bench makes (`graded/design_bench.Watched`):

- the quota: no client ever holds more than its quota; a request whose prompt + max_tokens
  exceeds its client's quota is refused by `add` (return the reason: it could never run);
  each client's requests are dispatched in the order they arrived;
- nothing held back that has room: `peek` gives None only when no waiting client's next
  request fits what its quota leaves, and it never offers one that does not (the admission
  round itself stops at a request the pool cannot take, as Algorithm 2's does);
- equal shares: two clients without a quota, both always waiting, get equal service beside a
  capped client, whatever the sizes of their requests;
- a bounded gap: on random workloads and on adversarial ones (a client that comes and goes
  beside a capped one that floods), two clients without a quota, both waiting, stay within
  your `gap_bound(u)` and within 4U.

The workloads `minivtc course test d1` runs are public examples; `minivtc course grade` draws
others, from a seed your edition does not hold, so tune nothing to them. The package's
policies (VTC and its family, DRR) are out of reach here as in the capstone.
"""

from __future__ import annotations

from minivtc.course.instructor.quota_answer import QuotaVTC
from minivtc.fairness.cost import PAPER_COST, Cost

__all__ = ["QuotaPolicy"]


class QuotaPolicy(QuotaVTC):
    """The instructor's answer: VTC over the clients with room (`instructor/quota_answer.py`)."""

    def __init__(self, quotas: dict[str, int] | None = None, cost: Cost = PAPER_COST) -> None:
        super().__init__(quotas, cost)
        self.name = "quota"
