"""The catalogue's wrong solutions of the design assignments: d1 (quotas) and d2 (tenants).

Owns `D1` and `D2`, written as `wrong.py`'s are (`edits.py`): edits of the instructor's answers
(`course/instructor/`), of the policy class built on each in the assignment's own file, or a
file written whole (a student's first design). Each is a mistake a student makes; each must
lose points (`minivtc course check-grader --only d1_quota --only d2_tenants`). Not shipped in
the student edition: it quotes the answers.
"""

from __future__ import annotations

from minivtc.course.edits import Wrong, drop, replace, rewrite, wrong

__all__ = ["D1", "D2"]

QUOTA, TENANTS = "course/instructor/quota_answer.py", "course/instructor/tenants_answer.py"
Q_ADD, Q_PEEK, Q_DISPATCH = (
    (QUOTA, "QuotaVTC.add"),
    (QUOTA, "QuotaVTC.peek"),
    (QUOTA, "QuotaVTC.dispatch"),
)
Q_DECODE, Q_FINISH = (QUOTA, "QuotaVTC.on_decode"), (QUOTA, "QuotaVTC.on_finish")
Q_UPDATE, Q_ROOM = (QUOTA, "QuotaVTC.update"), (QUOTA, "QuotaVTC.has_room")
Q_POLICY = ("course/design/quota.py", "QuotaPolicy.__init__")
T_ARRIVE, T_PEEK = (TENANTS, "Counters.arrive"), (TENANTS, "TenantVTC.peek")
T_CHARGE, T_DISPATCH = (TENANTS, "TenantVTC.charge"), (TENANTS, "TenantVTC.dispatch")
T_POLICY = ("course/design/tenants.py", "TenantPolicy.__init__")


def states(key: str, target: tuple[str, str], what: str, method: str, bound: str) -> Wrong:
    """The policy states `bound` (an expression of U, `u`) as `method`, whatever it does."""
    statement = f"_s.name = _n\n_s.{method} = lambda u: {bound}"
    return wrong(key, what, rewrite(target, "_s.name = _n", statement))


# A first design many students write: VTC whose peek skips the clients at their quota, with
# VTC's lift on arrival, to the smallest counter of any waiting client, capped ones included.
SKIPPING_VTC = '''"""My d1: VTC, skipping the clients whose quota is full."""

from collections import deque

from minivtc.fairness.cost import PAPER_COST
from minivtc.fairness.scheduler import Scheduler


class QuotaPolicy(Scheduler):
    BOUND = ("Two clients without a quota that both wait receive service within 2U of each "
             "other: the pick is the smallest counter among the clients with room, charged "
             "h(n_p, 0) at dispatch and each token as it comes, and a client that joins is "
             "lifted to the smallest waiting counter, so Lemma 4.3 keeps the waiting counters "
             "within U, and two counters within U at both ends of an interval give 2U.")

    def __init__(self, quotas=None, cost=PAPER_COST):
        self.quotas, self.cost, self.name = dict(quotas or {}), cost, "quota"
        self.queues, self.counters, self.held, self.charged = {}, {}, {}, {}
        self.last_left = None

    def add(self, request, now):
        c, quota = request.client_id, self.quotas.get(request.client_id)
        if quota is not None and request.max_num_tokens > quota:
            return "over its quota"
        queue = self.queues.setdefault(c, deque())
        if not queue:
            waiting = [self.counters[k] for k, q in self.queues.items() if q]
            floor = min(waiting) if waiting else self.counters.get(self.last_left, 0.0)
            self.counters[c] = max(self.counters.get(c, 0.0), floor)
        queue.append(request)

    def room(self, c):
        quota = self.quotas.get(c)
        head = self.queues[c][0].max_num_tokens
        return quota is None or self.held.get(c, 0) + head <= quota

    def peek(self):
        ready = [c for c, q in self.queues.items() if q and self.room(c)]
        c = min(ready, key=self.counters.__getitem__, default=None)
        return None if c is None else self.queues[c][0]

    def dispatch(self, request):
        c = request.client_id
        self.charged[request.request_id] = self.cost(request.num_prompt, 0)
        self.counters[c] += self.charged[request.request_id]
        self.held[c] = self.held.get(c, 0) + request.max_num_tokens
        self.queues[c].popleft()
        if not self.queues[c]:
            self.last_left = c

    def on_decode(self, requests):
        for r in requests:
            now = self.cost(len(r.prompt_ids), len(r.output_ids))
            self.counters[r.client_id] += now - self.charged[r.request_id]
            self.charged[r.request_id] = now

    def on_finish(self, request):
        self.held[request.client_id] -= request.max_num_tokens

    def remove(self, request):
        self.queues[request.client_id].remove(request)

    def requeue(self, request):
        self.queues[request.client_id].appendleft(request)

    def waiting(self):
        return (r for q in self.queues.values() for r in q)

    def gap_bound(self, u):
        return 2 * u
'''

D1 = [
    wrong("d1_quota", "peek ignores the quotas", replace(Q_ROOM, "_q is None or _x", "True")),
    wrong(
        "d1_quota",
        "the quota checked against the prompt only, not prompt + max_tokens",
        replace(Q_ROOM, "_a + _b.max_num_tokens <= _c", "_a + _b.num_prompt <= _c"),
    ),
    wrong(
        "d1_quota",
        "a request larger than its quota is accepted (it waits forever)",
        drop(Q_ADD, "if _c:\n    return _r"),
    ),
    wrong("d1_quota", "on_finish never gives the room back", drop(Q_FINISH, "_.held[_] -= _")),
    wrong(
        "d1_quota",
        "the round stops at a client held back by its quota, instead of passing it by",
        replace(Q_PEEK, "_c in _s.in_q", "_s.queues[_c]"),
        replace(
            Q_PEEK,
            "None if _c is None else _x",
            "None if _c is None or not self.has_room(_c) else _x",
        ),
    ),
    wrong(
        "d1_quota",
        "no lift: a client keeps the counter it had, however long it was away",
        rewrite(Q_UPDATE, "_s.counters[_c] = max(_a, _f)", "_s.counters.setdefault(_c, _f)"),
    ),
    Wrong(
        "d1_quota",
        "VTC whose peek skips capped clients, lifted to any waiting client's least counter",
        own_file=SKIPPING_VTC,
    ),
    wrong("d1_quota", "no prompt charge", drop(Q_DISPATCH, "_.counters[_] += _")),
    wrong("d1_quota", "no decode charge", drop(Q_DECODE, "_.counters[_] += _")),
    states("d1_quota", Q_POLICY, "no bound stated", "gap_bound", "None"),
    states("d1_quota", Q_POLICY, "states 4U whatever the policy does", "gap_bound", "4 * u"),
    states(
        "d1_quota", Q_POLICY, "states a bound that ignores U (a constant)", "gap_bound", "100.0"
    ),
]
D2 = [
    wrong(
        "d2_tenants",
        "flat: the user with the smallest counter, whatever its tenant",
        replace(
            T_PEEK,
            "_s.users[_t].least()",
            "min((u for c in self.users.values() for u in c.values if c.waiting.get(u)), "
            "key=lambda u: self.users[tenant_of(u)].values[u])",
        ),
    ),
    wrong(
        "d2_tenants",
        "a tenant's users served in arrival order, not ranked by counter",
        replace(
            T_PEEK,
            "_s.users[_t].least()",
            "min((u for u in self.queues if tenant_of(u) == tenant and self.queues[u]), "
            "key=lambda u: self.queues[u][0].arrival_time)",
        ),
    ),
    wrong(
        "d2_tenants",
        "no lift: a tenant or user keeps the counter it had, however long it was away",
        rewrite(T_ARRIVE, "_s.values[_m] = max(_a, _b)", "_s.values.setdefault(_m, 0.0)"),
    ),
    wrong(
        "d2_tenants",
        "only the user's counter is charged, not its tenant's",
        drop(T_CHARGE, "_s.tenants.values[_] += _"),
    ),
    wrong(
        "d2_tenants",
        "only the tenant's counter is charged, not its user's",
        drop(T_CHARGE, "_s.users[_].values[_] += _"),
    ),
    wrong(
        "d2_tenants",
        "each user's requests served last in, first out",
        replace(T_PEEK, "_s.queues[_u][0]", "_s.queues[_u][-1]"),
        replace(T_DISPATCH, "_s.queues[_c][0] is _r", "_s.queues[_c][-1] is _r"),
        replace(T_DISPATCH, "_s.queues[_c].popleft()", "_s.queues[_c].pop()"),
    ),
    states("d2_tenants", T_POLICY, "no user bound stated", "user_gap_bound", "None"),
    states("d2_tenants", T_POLICY, "states a tenant bound looser than 4U", "gap_bound", "5 * u"),
    states("d2_tenants", T_POLICY, "states a user bound that ignores U", "user_gap_bound", "10.0"),
]
