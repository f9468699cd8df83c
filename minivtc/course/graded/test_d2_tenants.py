"""Assignment d2: fairness between tenants and between each tenant's users
(`course/design/tenants.py`).

Graded by mechanism (`assignments.D2_RUBRIC`), by properties any right answer has, whatever its
design: work conservation, tenants sharing equally whatever their number of users, users
sharing their tenant's service equally, and backlogged gaps within the bounds the policy
states, at both levels. The random workloads are drawn from the instructor's hidden seed at
grading (`design_bench.seeds`), from the public examples in the student edition; every run is
served by the course's bench (`testbed.py`) through `design_bench.Watched`."""

from __future__ import annotations

import pytest

from minivtc.course.design.tenants import TenantPolicy
from minivtc.course.graded.design_bench import (
    SIZE_IDS,
    SIZES,
    Watched,
    by_tenant,
    check_equal_shares,
    check_gap,
    check_states_bounds,
    seeds,
    serve_watched,
    tenant_of,
    tenant_workload,
    u_of,
)
from minivtc.course.graded.driver import Arrival, Step

__all__ = []

SEEDS = seeds(2)


def run(arrivals: list[Arrival], kv_tokens: int) -> tuple[Watched, list[Step]]:
    watch, steps, _ = serve_watched(TenantPolicy(), arrivals, kv_tokens)
    return watch, steps


def bounds(u: float) -> tuple[float, float]:
    """The stated bounds: tenants', users'."""
    tenants, users = TenantPolicy().gap_bound(u), TenantPolicy().user_gap_bound(u)
    assert tenants is not None and users is not None, "state both bounds (not None)"
    return tenants, users


def check_gaps(steps: list[Step], arrivals: list[Arrival], u: float, what: str) -> None:
    """Tenants within gap_bound(u), each tenant's users within user_gap_bound(u), all 4U."""
    tenants, users = bounds(u)
    names = sorted({tenant_of(a.client) for a in arrivals})
    hint = "charge the tenant for every token of its users, and lift a tenant that joins"
    check_gap(by_tenant(steps), names, u, tenants, who=what + ": tenants {f} and {g}", hint=hint)
    for t in names:
        mine = sorted({a.client for a in arrivals if tenant_of(a.client) == t})
        who = what + ": users {f} and {g} of tenant " + t
        hint = "rank a tenant's users by what each got, and lift a user that joins"
        check_gap(steps, mine, u, users, who=who, hint=hint, stated="user_gap_bound")


def test_it_is_a_scheduler_and_states_its_bounds():
    """TenantPolicy is a Scheduler; both bounds are finite and within 4U; BOUND argues them."""
    policy = TenantPolicy()
    check_states_bounds(
        policy,
        lambda u: [policy.gap_bound(u), policy.user_gap_bound(u)],
        "state your bounds and argue for them",
    )


def test_a_preempted_request_waits_first_again_and_an_aborted_one_is_forgotten():
    """As the engine calls them: a request preempted (`requeue`) is offered again before its
    user's later ones; one aborted while waiting (`remove`) is gone, and its user with it."""
    from minivtc.requests.params import SamplingParams
    from minivtc.requests.request import Request, Status

    policy = TenantPolicy()
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    first, second = (Request(f"r{i}", "T/a", [5] * 4, params, 0.0) for i in range(2))
    other = Request("r2", "T/b", [5] * 4, params, 0.0)
    for r in (first, second, other):
        policy.add(r, 0.0)
    assert policy.peek() is first, "peek offers the first request of the first user"
    first.status = Status.RUNNING
    policy.dispatch(first)
    first.num_preemptions, first.status = 1, Status.WAITING
    policy.requeue(first)
    policy.remove(other)  # aborted while waiting: T/b waits no more
    assert policy.peek() is first, "a preempted request waits again at the head of its user's"
    policy.remove(second)
    assert [r.request_id for r in policy.waiting()] == ["r0"], "remove forgets r1 and r2"
    assert policy.peek() is first, "the preempted request, the only one waiting, is offered"


@pytest.mark.parametrize("seed", SEEDS)
def test_it_never_idles_while_a_request_waits(seed):
    """On a random workload: peek never gives None while a request waits, and each user's
    requests go in arrival order."""
    arrivals, m = tenant_workload(seed)
    watch, _ = run(arrivals, m)
    assert not watch.broken, f"workload {seed}: {watch.broken[0]}"


def test_tenants_share_equally_whatever_their_number_of_users():
    """Tenant X with one user and tenant Y with four, all always waiting: X and Y get equal
    service (a flat policy gives Y four times X's)."""
    clients = ["X/a", "Y/a", "Y/b", "Y/c", "Y/d"]
    arrivals = [Arrival(0.0, c, 8, 8) for c in clients for _ in range(100)]
    _, steps = run(arrivals, 96)
    what = "tenant X (1 user) and Y (4 users), always waiting"
    check_equal_shares(by_tenant(steps), {"X", "Y"}, ("X", "Y"), what)


@pytest.mark.parametrize("sizes", SIZES, ids=SIZE_IDS)
def test_users_of_a_tenant_share_equally_whatever_their_request_sizes(sizes):
    """Tenant T's users a and b (requests of different sizes) and tenant S's one user, all
    always waiting: a and b get equal service."""
    arrivals = [Arrival(0.0, "T/a", *sizes[0]) for _ in range(150)]
    arrivals += [Arrival(0.0, "T/b", *sizes[1]) for _ in range(150)]
    arrivals += [Arrival(0.0, "S/a", 10, 10) for _ in range(150)]
    _, steps = run(arrivals, 120)
    what = "users a and b of tenant T, always waiting"
    check_equal_shares(steps, {"T/a", "T/b", "S/a"}, ("T/a", "T/b"), what)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_gaps_stay_within_your_bounds_on_random_workloads(seed):
    """Two waiting tenants, and two waiting users of one tenant, stay within your bounds."""
    arrivals, m = tenant_workload(seed)
    _, steps = run(arrivals, m)
    check_gaps(steps, arrivals, u_of(arrivals, m), f"workload {seed}")


def tenant_comes_and_goes() -> tuple[list[Arrival], int]:
    """Tenant A's two users flood; tenant B's one user sends 30 at once, is served, and is
    quiet until 300 time units later, four times: B must rejoin at A's level."""
    a = [Arrival(float(t), f"A/{u}", 8, 8) for t in range(1200) for u in "xy"]
    b = [Arrival(float(300 * k), "B/x", 8, 8) for k in range(4) for _ in range(30)]
    return a + b, 64


def user_comes_and_goes() -> tuple[list[Arrival], int]:
    """Tenant A's user x floods, its user y sends 30 at once every 300 time units; tenant B
    floods: y must rejoin at x's level, and A's share stays A's."""
    flood = [Arrival(float(t), c, 8, 8) for t in range(1200) for c in ("A/x", "B/x")]
    return flood + [Arrival(float(300 * k), "A/y", 8, 8) for k in range(4) for _ in range(30)], 64


def flood_across_users() -> tuple[list[Arrival], int]:
    """Theorem 4.8's construction, F's and G's requests each spread over three users."""
    m = 100
    first = [Arrival(0.0, "F/a", 1, m - 1)]
    return first + [Arrival(0.5, f"{t}/{u}", 1, m - 1) for t in "FG" for u in "abc"], m


def joins_an_empty_queue() -> tuple[list[Arrival], int]:
    """Tenant A sends 20 at once and 30 more at 35; tenant B's first 30 come at 34, when A's
    are all running and none waits: B must join at the level of the last to leave, not at 0."""
    a = [Arrival(0.0, "A/x", 8, 8) for _ in range(20)] + [Arrival(35.0, "A/x", 8, 8)] * 30
    return a + [Arrival(34.0, "B/x", 8, 8) for _ in range(30)], 64


ADVERSARIAL = [tenant_comes_and_goes, user_comes_and_goes, flood_across_users, joins_an_empty_queue]


@pytest.mark.parametrize("make", ADVERSARIAL, ids=lambda f: f.__name__)
def test_the_gaps_stay_within_your_bounds_on_adversarial_workloads(make):
    """A tenant that comes and goes, a user that comes and goes within its tenant, a flood
    spread over users: both levels within your bounds."""
    arrivals, m = make()
    watch, steps = run(arrivals, m)
    assert not watch.broken, f"{make.__name__}: {watch.broken[0]}"
    check_gaps(steps, arrivals, u_of(arrivals, m), make.__name__)
