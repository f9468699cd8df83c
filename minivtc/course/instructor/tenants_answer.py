"""The instructor's answer to d2 (`course/design/tenants.py`): VTC twice, tenants then users.

One set of counters ranks the tenants, and one per tenant ranks its users; each is Algorithm
2's (`Counters`: the lift on joining, the last to leave). The pick is the tenant with the
smallest counter among those with a request waiting, then its user with the smallest; every
charge goes to both the tenant's counter and the user's. Lemma 4.3 then holds at each level:
among the waiting tenants, and among the waiting users of one tenant (whose counters rise only
by what that tenant is charged). Ours, not the paper's (the paper's clients are flat). Kept out
of the student edition with the rest of `instructor/`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from minivtc.fairness.cost import PAPER_COST, Cost
from minivtc.fairness.scheduler import Scheduler
from minivtc.requests.request import Request

__all__ = ["TenantVTC"]

BOUND = (
    "Two tenants both backlogged over an interval receive service within 2U of each other, "
    "and so do two users of one tenant, U = max(w_p L_input, w_q M), w_p <= w_q, under full "
    "reservation, no preemption and no refunds. Tenants: their counters are VTC's over the "
    "tenants (a tenant waits while any of its users does): the pick is the smallest waiting "
    "tenant, charged h(n_p, 0) at dispatch (at most w_p L_input) and its running requests' "
    "tokens as they come (at most w_q M while it waits), and a joining tenant is lifted to the "
    "smallest waiting counter, or the last to leave's, never lowered. So Lemma 4.3 holds among "
    "waiting tenants, and a tenant's service over an interval is its counter's change: 2U. "
    "Users of one tenant: the same argument on that tenant's own counters, which move only "
    "when the tenant is picked or its requests decode, so the same U bounds their spread. A "
    "tenant's number of users changes nothing at the tenant level. Near the bound: Theorem "
    "4.8's flood, with F's and G's requests spread over several users."
)


def tenant_of(client: str) -> str:
    """The tenant of client "tenant/user" (a client without "/" is a tenant of one user)."""
    return client.partition("/")[0]


class Counters:
    """Algorithm 2's counters over one set of members: lifted on joining, the last to leave."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}  # first-seen order: ties go to the first
        self.waiting: dict[str, int] = {}  # requests each member has waiting
        self.last_left: str | None = None

    def arrive(self, member: str) -> None:
        if not self.waiting.get(member):  # joins: lifted to the floor, never lowered
            self.values[member] = max(self.values.get(member, 0.0), self.floor())
        self.waiting[member] = self.waiting.get(member, 0) + 1

    def depart(self, member: str) -> None:
        self.waiting[member] -= 1
        if not self.waiting[member]:
            self.last_left = member

    def least(self) -> str | None:
        return min(
            (m for m in self.values if self.waiting.get(m)),
            key=self.values.__getitem__,
            default=None,
        )

    def floor(self) -> float:
        waiting = [self.values[m] for m in self.values if self.waiting.get(m)]
        if waiting:
            return min(waiting)
        return self.values[self.last_left] if self.last_left else 0.0


class TenantVTC(Scheduler):
    """Two-level VTC: the tenant with the smallest counter, then its user's (the docstring)."""

    BOUND = BOUND

    def __init__(self, cost: Cost = PAPER_COST) -> None:
        self.cost = cost
        self.name = "tenant-vtc"
        self.queues: dict[str, deque[Request]] = {}  # client "tenant/user" -> its requests
        self.tenants = Counters()
        self.users: dict[str, Counters] = {}  # tenant -> its users' counters
        self.charged: dict[str, float] = {}  # request id -> h(n_p, n_q) charged so far

    def add(self, request: Request, now: float) -> str | None:
        self.arrive(request)
        self.queues[request.client_id].append(request)
        return None

    def peek(self) -> Request | None:
        tenant = self.tenants.least()
        if tenant is None:
            return None
        user = self.users[tenant].least()
        assert user is not None, f"tenant {tenant} waits with no user waiting"
        return self.queues[user][0]

    def dispatch(self, request: Request) -> None:
        client = request.client_id
        assert self.queues[client][0] is request, "dispatch takes the request peek offered"
        if not request.num_preemptions:  # a readmitted request paid its prompt already
            self.charged[request.request_id] = 0.0
            self.charge(request, self.cost(request.num_prompt, 0))
        self.queues[client].popleft()
        self.depart(request)

    def on_decode(self, requests: list[Request]) -> None:
        for r in requests:
            self.charge(r, self.cost(len(r.prompt_ids), len(r.output_ids)))

    def on_finish(self, request: Request) -> None:
        self.charged.pop(request.request_id, None)

    def remove(self, request: Request) -> None:
        self.queues[request.client_id].remove(request)
        self.depart(request)

    def requeue(self, request: Request) -> None:
        self.arrive(request)
        self.queues[request.client_id].appendleft(request)

    def waiting(self) -> Iterator[Request]:
        return (r for q in self.queues.values() for r in q)

    def gap_bound(self, u: float) -> float | None:
        return 2 * u

    def user_gap_bound(self, u: float) -> float | None:
        return 2 * u

    def charge(self, request: Request, now: float) -> None:
        """Charge `request`'s client up to h = `now`: its tenant's counter and its own."""
        client = request.client_id
        amount = now - self.charged[request.request_id]
        self.charged[request.request_id] = now
        self.tenants.values[tenant_of(client)] += amount
        self.users[tenant_of(client)].values[client] += amount

    def arrive(self, request: Request) -> None:
        """Its tenant joins first (if none of its users waited), then its user."""
        client = request.client_id
        self.queues.setdefault(client, deque())
        self.tenants.arrive(tenant_of(client))
        self.users.setdefault(tenant_of(client), Counters()).arrive(client)

    def depart(self, request: Request) -> None:
        self.users[tenant_of(request.client_id)].depart(request.client_id)
        self.tenants.depart(tenant_of(request.client_id))
