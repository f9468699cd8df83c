"""What the design assignments' tests share (d1, d2): a watch on the policy, the checks both
make, and workloads.

Owns `Watched` (a `Scheduler` that passes every call the bench makes on to the student's
policy and checks, from those calls alone, what the policy must never do: offer a request out
of its client's arrival order, one that takes its client over its quota, or nothing while a
request with room waits) and `serve_watched` (a run of the bench through it); the checks both
assignments grade by (`check_states_bounds`: a Scheduler whose stated bounds are finite, within
4U and argued; `check_gap`: a backlogged gap within a stated bound; `check_equal_shares`);
`seeds` (the workloads' seeds: the instructor's hidden ones where `course/instructor/hidden.py`
is present, from `MINIVTC_HIDDEN_SEED` where set; the public examples in the student edition),
the random workloads drawn from them (`traffic`, the arrivals both draw), the sizes both
equal-share tests use (`SIZES`), and `by_tenant` (a run's steps with each tenant's users
summed). Plain Python, no clock: the same seed gives the same workloads on every run.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Iterator

from minivtc.course.graded.driver import W_P, W_Q, Arrival, Step
from minivtc.course.graded.testbed import serve, worst_gap
from minivtc.fairness.scheduler import Scheduler
from minivtc.requests.request import Request

__all__ = ["PUBLIC_SEEDS", "SIZES", "SIZE_IDS", "Watched", "by_tenant", "check_equal_shares"]
__all__ += ["check_gap", "check_states_bounds", "quota_workload", "seeds", "serve_watched"]
__all__ += ["tenant_of", "tenant_workload", "traffic", "u_of"]

# The student edition's workloads (`minivtc course test`): documented, so a student can replay
# one. Grading draws as many others from the instructor's seed.
PUBLIC_SEEDS = (11, 12, 13, 14, 15, 16, 17, 18, 19, 20)
NUM_WORKLOADS = len(PUBLIC_SEEDS)
# Two clients' (prompt, max_tokens) in the equal-share tests: short beside long, and a long
# prompt with a short output beside the reverse (equal shares whatever the sizes)
SIZES = [((4, 4), (16, 40)), ((40, 2), (2, 20))]
SIZE_IDS = ["small-large", "prompt-output"]


def seeds(salt: int) -> tuple[int, ...]:
    """The workloads' seeds: `NUM_WORKLOADS` drawn from the instructor's hidden seed (with
    `salt`, one per assignment; `MINIVTC_HIDDEN_SEED` where set, `hidden.seed`), or, where it is
    absent (the student edition), the public ones."""
    try:
        from minivtc.course.instructor.hidden import seed
    except ImportError:  # the student edition: `course/instructor/` is left out
        return PUBLIC_SEEDS
    rng = random.Random(seed() * 1000 + salt)
    return tuple(rng.randrange(10**9) for _ in range(NUM_WORKLOADS))


def u_of(arrivals: list[Arrival], kv_tokens: int) -> float:
    """Lemma 4.3's U for a run (w_p <= w_q): max(w_p L_input, w_q M)."""
    return max(W_P * max(a.prompt for a in arrivals), W_Q * kv_tokens)


class Watched(Scheduler):
    """`policy`, with what it must never do recorded in `broken` (first first). `quotas`:
    client -> the most tokens it may hold (none: no client is capped)."""

    def __init__(self, policy: Scheduler, quotas: dict[str, int] | None = None) -> None:
        self.policy, self.quotas = policy, dict(quotas or {})
        self.cost, self.name = policy.cost, policy.name
        self.queues: dict[str, deque[Request]] = {}  # waiting, as the bench's calls say
        self.held: dict[str, int] = {}  # tokens each client's running requests reserve
        self.most: dict[str, int] = {}  # the most each client ever held
        self.broken: list[str] = []

    def add(self, request: Request, now: float) -> str | None:
        reason = self.policy.add(request, now)
        c, quota = request.client_id, self.quotas.get(request.client_id)
        never_fits = quota is not None and request.max_num_tokens > quota
        if reason is None and never_fits:
            self.broken.append(
                f"add() accepted a request of {c} with prompt + max_tokens = "
                f"{request.max_num_tokens} > its quota {quota}: it could never run, refuse it"
            )
        elif reason is not None and not never_fits:
            self.broken.append(f"add() refused a request that fits {c}'s quota: {reason!r}")
        if reason is None:
            self.queues.setdefault(c, deque()).append(request)
        return reason

    def peek(self) -> Request | None:
        r = self.policy.peek()
        if r is None:
            ready = [c for c, q in self.queues.items() if q and self.room(c) >= q[0].max_num_tokens]
            if ready:
                self.broken.append(
                    f"peek() gave None while {ready[0]}'s next request waited with room in its "
                    f"quota ({self.room(ready[0])} tokens free): nothing that can run is held back"
                )
            return None
        queue = self.queues.get(r.client_id)
        if not queue or queue[0] is not r:
            self.broken.append(
                f"peek() offered {r.request_id} of {r.client_id} before a request {r.client_id} "
                "sent earlier: each client's requests go in arrival order"
            )
        elif r.max_num_tokens > self.room(r.client_id):
            self.broken.append(
                f"peek() offered {r.client_id}'s request of {r.max_num_tokens} tokens while it "
                f"holds {self.held.get(r.client_id, 0)} of its quota "
                f"{self.quotas[r.client_id]}: over its quota"
            )
        return r

    def dispatch(self, request: Request) -> None:
        c = request.client_id
        self.policy.dispatch(request)
        self.queues[c].remove(request)
        self.held[c] = self.held.get(c, 0) + request.max_num_tokens
        self.most[c] = max(self.most.get(c, 0), self.held[c])

    def on_decode(self, requests: list[Request]) -> None:
        self.policy.on_decode(requests)

    def on_finish(self, request: Request) -> None:
        self.held[request.client_id] -= request.max_num_tokens
        self.policy.on_finish(request)

    def remove(self, request: Request) -> None:
        self.policy.remove(request)

    def requeue(self, request: Request) -> None:
        self.policy.requeue(request)

    def waiting(self) -> Iterator[Request]:
        return self.policy.waiting()

    def check_invariants(self) -> None:
        self.policy.check_invariants()

    def room(self, client: str) -> float:
        quota = self.quotas.get(client)
        return float("inf") if quota is None else quota - self.held.get(client, 0)


def serve_watched(
    policy: Scheduler, arrivals: list[Arrival], kv_tokens: int, quotas: dict[str, int] | None = None
) -> tuple[Watched, list[Step], list[tuple[Arrival, str]]]:
    """The bench's run of `policy` through the watch: (watch, steps, refused arrivals)."""
    watch = Watched(policy, quotas)
    _, steps, refused = serve(watch, arrivals, kv_tokens)
    return watch, steps, refused


def check_states_bounds(
    policy: Scheduler, bounds: Callable[[float], list[float | None]], argue: str
) -> None:
    """`policy` is a Scheduler; for U of 64, 256 and 10,000, each bound it states (`bounds(U)`)
    is a finite number within 4U; its `BOUND` has 40 words or more (else: `argue`)."""
    assert isinstance(policy, Scheduler), f"{type(policy).__name__} must be a Scheduler"
    for u in (64.0, 256.0, 10_000.0):
        for bound in bounds(u):
            assert bound is not None and math.isfinite(bound) and 0 <= bound <= 4 * u, (
                f"a bound of {bound} for U = {u:g}: state a finite bound within 4U"
            )
    words = len(str(getattr(type(policy), "BOUND", "")).split())
    assert words >= 40, f"BOUND has {words} words: {argue}"


def check_gap(
    steps: list[Step],
    clients: list[str],
    u: float,
    bound: float,
    *,
    who: str,
    hint: str,
    stated: str = "gap_bound",
) -> None:
    """The worst service gap between two of `clients` while both are backlogged is within
    `bound` (the policy's `stated` method's) and 4U. `who` names the pair, `{f}` and `{g}`
    standing for its clients; `hint` says what to look at."""
    gap, f, g = worst_gap(steps, clients)
    assert gap <= min(bound, 4 * u) + 1e-6, (
        f"{who.format(f=f, g=g)} both waiting, service gap {gap:g} ({gap / u:.2f}U) > your "
        f"{stated}(U = {u:g}) = {bound:g} or 4U: {hint}"
    )


def check_equal_shares(
    steps: list[Step], waiting: set[str], compared: tuple[str, str], what: str
) -> None:
    """Over the steps in which all of `waiting` were backlogged, the two `compared` clients got
    service within 15% of each other (else: `what`, the service)."""
    busy = [s for s in steps if waiting <= s.backlogged]
    total = {c: sum(s.service.get(c, 0.0) for s in busy) for c in compared}
    assert busy and abs(total[compared[0]] - total[compared[1]]) <= 0.15 * max(total.values()), (
        f"{what}: service {total}, not within 15%"
    )


def quota_workload(seed: int) -> tuple[list[Arrival], int, dict[str, int]]:
    """d1's random workload: 3-5 clients, one or two of them capped (a quota between one
    request and half the pool), Poisson or bursty arrivals; a few requests of a capped client
    exceed its quota (they must be refused)."""
    rng = random.Random(seed)
    kv_tokens, n = rng.randint(60, 160), rng.randint(3, 5)
    clients = [f"c{i}" for i in range(n)]
    max_len = min(30, kv_tokens // 4)
    quotas = {c: rng.randint(2 * max_len, kv_tokens // 2) for c in clients[: rng.randint(1, 2)]}
    out, t = traffic(rng, clients, max_len)
    capped = sorted(quotas)
    out += [Arrival(t / 2, c, quotas[c], 1) for c in capped]  # prompt + 1 > quota: refused
    return out, kv_tokens, quotas


def tenant_workload(seed: int) -> tuple[list[Arrival], int]:
    """d2's random workload: 2-3 tenants of 1-3 users each ("t0/u1"), Poisson or bursty."""
    rng = random.Random(seed)
    kv_tokens = rng.randint(60, 160)
    clients = [f"t{t}/u{u}" for t in range(rng.randint(2, 3)) for u in range(rng.randint(1, 3))]
    max_len = min(30, kv_tokens // 4)
    return traffic(rng, clients, max_len)[0], kv_tokens


def traffic(rng: random.Random, clients: list[str], max_len: int) -> tuple[list[Arrival], float]:
    """40-120 requests of `clients`, Poisson or bursty, each of `sizes`; and the time the last
    arrived (before its rounding to the hundredth)."""
    out, t, bursty = [], 0.0, rng.random() < 0.5
    for _ in range(rng.randint(40, 120)):
        t += rng.choice([0.0, 0.0, 0.0, 20.0]) if bursty else rng.expovariate(0.5)
        out.append(Arrival(round(t, 2), rng.choice(clients), *sizes(rng, max_len)))
    return out, t


def sizes(rng: random.Random, max_len: int) -> tuple[int, int]:
    """A request's prompt and max_tokens, each 1 to `max_len`."""
    return rng.randint(1, max_len), rng.randint(1, max_len)


def tenant_of(client: str) -> str:
    return client.partition("/")[0]


def by_tenant(steps: list[Step]) -> list[Step]:
    """`steps` with each tenant's users summed: a tenant waits while any of its users waits."""
    out = []
    for s in steps:
        service: dict[str, float] = {}
        for c, v in s.service.items():
            service[tenant_of(c)] = service.get(tenant_of(c), 0.0) + v
        out.append(Step({tenant_of(c) for c in s.backlogged}, service))
    return out
