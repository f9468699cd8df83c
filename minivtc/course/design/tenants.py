"""Assignment d2: fairness between tenants, and between the users of each tenant.

A client here is "tenant/user": an organisation (the tenant) with several users. The paper's
clients are flat, so a tenant that opens ten accounts gets ten shares; this package states no
bound for tenants: the policy and its bounds are yours. Write `TenantPolicy(cost)`, a
`Scheduler` (`minivtc/fairness/scheduler.py`), fair at two levels: tenants share the server
equally whatever their number of users, and the users of one tenant share what the tenant
gets. A tenant is waiting while any of its users has a request waiting. State:

- `gap_bound(u)`: the most service (w_p per prompt token, w_q per output token) by which one of
  two tenants, both waiting over an interval, may lead the other, given Lemma 4.3's U of the
  run (max(w_p L_input, w_q M): `cost.fairness_bound`); no looser than 4U;
- `user_gap_bound(u)`: the same for two users of one tenant, both waiting; no looser than 4U;
- `BOUND`: both bounds in words, with the argument (the instructor grades it).

What the grader checks (`graded/test_d2_tenants.py`), on the course's bench
(`graded/testbed.py`):

- work conservation: `peek` never gives None while a request waits; each user's requests are
  dispatched in the order they arrived;
- tenants share equally: two tenants always waiting, one with one user and one with four, get
  equal service (a flat fair policy gives the second four times as much);
- users share their tenant's service equally, whatever the sizes of their requests;
- bounded gaps: on random workloads and on adversarial ones (a tenant that comes and goes, a
  user that comes and goes within its tenant), two waiting tenants stay within your
  `gap_bound(u)`, two waiting users of one tenant within your `user_gap_bound(u)`, both
  within 4U.

The workloads `minivtc course test d2` runs are public examples; `minivtc course grade` draws
others, from a seed your edition does not hold. The package's policies (VTC and its family,
DRR) are out of reach here as in the capstone.
"""

from __future__ import annotations

from minivtc.course.instructor.tenants_answer import TenantVTC
from minivtc.fairness.cost import PAPER_COST, Cost

__all__ = ["TenantPolicy"]


class TenantPolicy(TenantVTC):
    """The instructor's answer: VTC over tenants, then over each tenant's users."""

    def __init__(self, cost: Cost = PAPER_COST) -> None:
        super().__init__(cost)
        self.name = "tenants"
