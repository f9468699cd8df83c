"""Assignment d1: fairness under per-client quotas (`course/design/quota.py`).

Graded by mechanism (`assignments.D1_RUBRIC`), by properties any right answer has, whatever
its design: the quota never exceeded, nothing held back that has room, equal shares beside a
capped client, a backlogged gap within the bound the policy states. The random workloads are
drawn from the instructor's hidden seed at grading (`design_bench.seeds`), from the public
examples in the student edition. Every run is served by the course's bench (`testbed.py`)
through `design_bench.Watched`, which checks each call from outside the policy."""

from __future__ import annotations

import pytest

from minivtc.course.design.quota import QuotaPolicy
from minivtc.course.graded.design_bench import (
    SIZE_IDS,
    SIZES,
    check_equal_shares,
    check_gap,
    check_states_bounds,
    quota_workload,
    seeds,
    serve_watched,
    u_of,
)
from minivtc.course.graded.driver import Arrival, Step
from minivtc.course.graded.testbed import worst_gap

__all__ = []

SEEDS = seeds(1)


def run(arrivals: list[Arrival], kv_tokens: int, quotas: dict[str, int]):
    """The bench's run of QuotaPolicy(quotas) through the watch: (watch, steps, refused)."""
    return serve_watched(QuotaPolicy(quotas), arrivals, kv_tokens, quotas)


def check_free_gap(steps: list[Step], clients: list[str], u: float, what: str) -> None:
    """Two of `clients` (no quota), both waiting, within the stated gap_bound(u) and 4U."""
    bound = QuotaPolicy().gap_bound(u)
    assert bound is not None, "gap_bound(u) returned None: state your policy's bound"
    hint = (
        "a client the quota holds back must not pull the lift's floor down, nor come back with "
        "credit it banked while held back"
    )
    check_gap(steps, clients, u, bound, who=what + ": {f} and {g} (no quota)", hint=hint)


def test_it_is_a_scheduler_and_states_its_bound():
    """QuotaPolicy is a Scheduler, gap_bound(u) is a finite number within 4U, BOUND argues it."""
    policy = QuotaPolicy()
    check_states_bounds(
        policy, lambda u: [policy.gap_bound(u)], "state your bound and argue for it"
    )


def test_the_stated_bound_is_reached_on_an_adversarial_workload(record_property):
    """Your bound is one your policy comes near: on the adversarial workloads its worst gap
    reaches at least a third of gap_bound(U) (reported whether the test passes or fails)."""
    slack = []
    for make in ADVERSARIAL:
        arrivals, m, quotas = make()
        u = u_of(arrivals, m)
        _, steps, _ = run(arrivals, m, quotas)
        gap = worst_gap(steps, sorted({a.client for a in arrivals} - set(quotas)))[0]
        bound = QuotaPolicy().gap_bound(u) or 0.0
        slack.append((bound / max(gap, 1e-9), make.__name__, gap / u, bound / u))
    least, name, gap_in_u, bound_in_u = min(slack)
    record_property("reported", f"slack {least:.2f} (at most 3 passes), on {name}")
    assert least <= 3.0, (
        f"your bound is {least:.2f} times your worst gap on the adversarial workloads (on "
        f"{name}: gap {gap_in_u:.2f}U, bound {bound_in_u:.2f}U): state the bound your argument "
        "gives, not the loosest one allowed"
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_no_client_ever_holds_more_than_its_quota(seed):
    """On a random workload: the quota is never exceeded, each client's requests go in
    arrival order, and a request that could never fit its quota is refused by add."""
    arrivals, m, quotas = quota_workload(seed)
    watch, _, refused = run(arrivals, m, quotas)
    over = [b for b in watch.broken if "quota" in b and "gave None" not in b or "order" in b]
    assert not over, f"workload {seed}: {over[0]}"
    for c, quota in quotas.items():
        assert watch.most.get(c, 0) <= quota, f"{c} held {watch.most[c]} > its quota {quota}"
    assert len(refused) == len(quotas), (
        f"workload {seed}: {len(refused)} requests refused, {len(quotas)} exceed their quota"
    )


def test_a_request_larger_than_its_quota_is_refused():
    """add returns a reason for a request whose prompt + max_tokens exceeds its quota, and two
    requests that fill the quota exactly run together."""
    arrivals = [Arrival(0.0, "c", 15, 6), Arrival(0.0, "c", 5, 5), Arrival(0.0, "c", 5, 5)]
    watch, _, refused = run(arrivals, 64, {"c": 20})
    assert not watch.broken, watch.broken[0]
    assert [a.output for a, _ in refused] == [6], f"refused {refused}, expected the 21-token one"
    assert watch.most.get("c") == 20, f"c held at most {watch.most.get('c')} of its quota 20"


def test_a_preempted_request_gives_its_room_back_and_an_aborted_one_is_forgotten():
    """As the engine calls them: a request preempted (`requeue`) waits again at the head of its
    client's queue and no longer holds its quota; one aborted while waiting (`remove`) is gone."""
    from minivtc.requests.params import SamplingParams
    from minivtc.requests.request import Request, Status

    policy = QuotaPolicy({"c": 20})
    first, second, third = (
        Request(f"r{i}", "c", [5] * 5, SamplingParams(max_tokens=15, ignore_eos=True), 0.0)
        for i in range(3)
    )
    for r in (first, second, third):
        assert policy.add(r, 0.0) is None, "a request of 20 tokens fits a quota of 20"
    assert policy.peek() is first, "peek offers c's first request"
    first.status = Status.RUNNING
    policy.dispatch(first)
    assert policy.peek() is None, "c holds its whole quota: nothing of c may be offered"
    first.num_preemptions, first.status = 1, Status.WAITING
    policy.requeue(first)  # preempted: its memory, and so its quota, is free again
    assert policy.peek() is first, "a preempted request waits again, first, and c has room"
    policy.remove(second)  # aborted while waiting
    assert [r.request_id for r in policy.waiting()] == ["r0", "r2"], "remove forgets r1"


@pytest.mark.parametrize("seed", SEEDS)
def test_nothing_is_held_back_that_has_room(seed):
    """On a random workload: peek gives None only when no waiting client's next request fits
    what its quota leaves (the admission round stops at the pool on its own)."""
    arrivals, m, quotas = quota_workload(seed)
    watch, _, _ = run(arrivals, m, quotas)
    held = [b for b in watch.broken if "gave None" in b]
    assert not held, f"workload {seed}: {held[0]}"


@pytest.mark.parametrize("sizes", SIZES, ids=SIZE_IDS)
def test_clients_without_a_quota_share_equally_beside_a_capped_one(sizes):
    """A and B (no quota) and C (a quota of a quarter of the pool) always waiting: A and B get
    equal service whatever their request sizes, and C never holds more than its quota."""
    quotas = {"C": 30}
    arrivals = [Arrival(0.0, "A", *sizes[0]) for _ in range(150)]
    arrivals += [Arrival(0.0, "B", *sizes[1]) for _ in range(150)]
    arrivals += [Arrival(0.0, "C", 10, 20) for _ in range(150)]
    watch, steps, _ = run(arrivals, 120, quotas)
    assert not watch.broken, watch.broken[0]
    what = "A and B, no quota, always waiting beside capped C"
    check_equal_shares(steps, {"A", "B", "C"}, ("A", "B"), what)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_gap_stays_within_your_bound_on_random_workloads(seed):
    """Two clients without a quota, both waiting, stay within your gap_bound(U) and 4U."""
    arrivals, m, quotas = quota_workload(seed)
    _, steps, _ = run(arrivals, m, quotas)
    free = sorted({a.client for a in arrivals} - set(quotas))
    check_free_gap(steps, free, u_of(arrivals, m), f"workload {seed}")


def come_and_go_beside_a_capped_flood() -> tuple[list[Arrival], int, dict[str, int]]:
    """A floods; C floods under a quota of one request, so it is served less than A; B sends
    30 at once, is served, and is quiet until 300 time units later, four times: B must rejoin
    at A's level, not C's."""
    a = [Arrival(float(t), x, 8, 8) for t in range(1200) for x in "AC"]
    b = [Arrival(float(300 * k), "B", 8, 8) for k in range(4) for _ in range(30)]
    return a + b, 64, {"C": 16}


def flood_beside_a_capped_client() -> tuple[list[Arrival], int, dict[str, int]]:
    """Theorem 4.8's construction (F fills the pool first, then F and G flood) beside C,
    capped at a fifth of the pool, flooding from the start."""
    m = 100
    flood = [Arrival(0.0, "F", 1, m - 1)]
    flood += [Arrival(0.5, x, 1, m - 1) for x in "FG" for _ in range(4)]
    return flood + [Arrival(0.0, "C", 2, 18) for _ in range(40)], m, {"C": 20}


def capped_returns_often() -> tuple[list[Arrival], int, dict[str, int]]:
    """A and B flood; C, capped at one request, sends one every 4 time units: its quota blocks
    and frees it over and over."""
    flood = [Arrival(float(t), x, 6, 6) for t in range(500) for x in "AB"]
    return flood + [Arrival(float(t), "C", 4, 8) for t in range(0, 500, 4)], 64, {"C": 12}


ADVERSARIAL = [
    come_and_go_beside_a_capped_flood,
    flood_beside_a_capped_client,
    capped_returns_often,
]


@pytest.mark.parametrize("make", ADVERSARIAL, ids=lambda f: f.__name__)
def test_the_gap_stays_within_your_bound_on_adversarial_workloads(make):
    """Two clients without a quota, both waiting, stay within your gap_bound(U) and 4U, beside
    a capped client: one comes and goes, one floods first, the capped one comes and goes."""
    arrivals, m, quotas = make()
    watch, steps, _ = run(arrivals, m, quotas)
    assert not watch.broken, f"{make.__name__}: {watch.broken[0]}"
    free = sorted({a.client for a in arrivals} - set(quotas))
    check_free_gap(steps, free, u_of(arrivals, m), make.__name__)
