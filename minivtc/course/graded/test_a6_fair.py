"""Assignment a6 (capstone): a fair policy of your own, plugged into the engine: Deficit Round
Robin as the paper's Appendix C.2 adapts it (`minivtc/core/drr.py` says what it must do).

Graded on its stated bound, two clients backlogged over an interval receive service within
2(U + Q), on random workloads through the real engine loop, and on the paper's workloads in
the simulator, side by side with VTC and FCFS."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from minivtc.core.cost import W_P, W_Q, ProfiledCost
from minivtc.core.drr import DRR
from minivtc.core.params import SamplingParams
from minivtc.core.request import Request
from minivtc.course.graded.harness import (
    Arrival,
    bound_u,
    drive,
    max_gap,
    random_arrivals,
    workloads,
)
from minivtc.harness import metrics
from minivtc.harness.sim import simulate
from minivtc.harness.workloads import workload

# Derandomized: the same submission gets the same examples, so the same points, on every run.
PROPERTY = settings(deadline=None, derandomize=True, database=None)


def request(client: str, prompt: int, name: str = "") -> Request:
    return Request(
        name or f"{client}{prompt}", client, [1] * prompt, SamplingParams(max_tokens=500), 0.0
    )


def dispatch_next(drr: DRR) -> Request:
    r = drr.peek()
    assert r is not None, "peek() gave None while requests were waiting"
    drr.dispatch(r)
    return r


def decode(drr: DRR, r: Request, tokens: int) -> None:
    for _ in range(tokens):
        r.output_ids.append(1)
        drr.on_decode([r])


def test_a_dispatch_costs_the_prompt_once():
    """A dispatch takes h(n_p, 0) from the deficit, and nothing when it is back from a
    preemption."""
    drr = DRR(100.0)
    r = request("a", 30)
    drr.add(r, 0.0)
    dispatch_next(drr)
    assert drr.deficits["a"] == 100.0 - W_P * 30, (
        f"a turn's quantum 100, then a 30-token prompt: the deficit is {drr.deficits['a']}, "
        f"not {100.0 - W_P * 30}"
    )
    r.num_preemptions = 1
    drr.requeue(r)  # it rejoins: no credit (0), then its turn's quantum
    dispatch_next(drr)
    assert drr.deficits["a"] == 100.0, (
        f"a request back from a preemption was charged again: deficit {drr.deficits['a']}, "
        "not 100 (its prompt was paid at its first dispatch)"
    )


def test_decode_charges_follow_any_cost_the_profiled_one_too():
    """Each generated token takes h(n_p, n_q) - h(n_p, n_q - 1) from the deficit."""
    h = ProfiledCost()
    drr = DRR(100.0, cost=h)
    r = request("a", 10)
    drr.add(r, 0.0)
    dispatch_next(drr)
    for n in range(1, 6):
        decode(drr, r, 1)
        assert drr.deficits["a"] == pytest.approx(100.0 - h(10, n)), (
            f"after {n} tokens of a 10-token prompt the deficit is {drr.deficits['a']:.4f}, not "
            f"Q - h(10, {n}) = {100.0 - h(10, n):.4f}"
        )


def test_a_rejoining_client_has_no_credit_but_keeps_its_debt():
    """A client that joins the round brings no credit (a positive deficit drops to 0) but keeps
    a debt (a negative deficit stays)."""
    drr = DRR(100.0)
    r1 = request("a", 10, "r1")
    drr.add(r1, 0.0)
    dispatch_next(drr)  # 90 left; a leaves the round
    drr.add(request("a", 10, "r2"), 0.0)
    assert drr.deficits["a"] == 0.0, (
        f"a rejoined with deficit {drr.deficits['a']}: a client cannot bank credit while idle"
    )
    dispatch_next(drr)  # its turn: 100, less 10
    decode(drr, r1, 60)  # 90 - 120 = -30
    drr.add(request("a", 10, "r3"), 0.0)
    assert drr.deficits["a"] == 90.0 - 60 * W_Q, (
        f"a rejoined owing {60 * W_Q - 90.0}: its deficit became {drr.deficits['a']}, the debt "
        "must stay (forgiven, a client that keeps leaving and rejoining never pays)"
    )


def test_the_turn_passes_when_the_deficit_is_spent():
    """A client dispatches while its deficit is positive; at 0 the turn passes."""
    drr = DRR(10.0)
    for r in (request("a", 10, "a1"), request("a", 10, "a2"), request("b", 10, "b1")):
        drr.add(r, 0.0)
    order = [dispatch_next(drr).request_id for _ in range(3)]
    assert order == ["a1", "b1", "a2"], (
        f"quantum 10, prompts of 10: dispatched {order}, not a1, b1, a2 (a's deficit is 0 after "
        "a1: spent, so b's turn)"
    )


def test_a_turn_lasts_while_the_deficit_is_positive_however_little():
    """A deficit of half a token is still positive: the client dispatches again."""
    drr = DRR(10.5)
    for r in (request("a", 10, "a1"), request("a", 10, "a2"), request("b", 10, "b1")):
        drr.add(r, 0.0)
    order = [dispatch_next(drr).request_id for _ in range(3)]
    assert order == ["a1", "a2", "b1"], (
        f"quantum 10.5, prompts of 10: dispatched {order}, not a1, a2, b1 (a's deficit 0.5 after "
        "a1 is positive: still a's turn)"
    )


def test_when_a_client_leaves_the_round_the_next_one_s_turn_begins():
    """A client whose queue empties leaves the round; the next client's turn begins, with its
    quantum."""
    drr = DRR(10.0)
    for client in "abc":
        drr.add(request(client, 5), 0.0)
    order = [dispatch_next(drr).client_id for _ in range(3)]
    assert order == ["a", "b", "c"], f"one request each from a, b, c in turn: dispatched {order}"


@pytest.mark.parametrize("quantum", [1.0, 32.0, 256.0])
@settings(PROPERTY, max_examples=25)
@given(w=workloads)
def test_the_service_gap_stays_within_2_u_plus_q(quantum, w):
    """Two backlogged clients' service stays within 2(U + Q), on random workloads through the
    engine."""
    arrivals = random_arrivals(w)
    u = bound_u(max(a.prompt for a in arrivals), w["kv_tokens"])
    _, steps, _ = drive(DRR(quantum), arrivals, w["kv_tokens"])  # (every request is served)
    clients = sorted({a.client for a in arrivals})
    for f in clients:
        for g in clients:
            if f < g:
                gap = max_gap(steps, f, g)
                assert gap <= 2 * (u + quantum), (
                    f"{f} and {g} both backlogged: service gap {gap} > 2(U + Q) = "
                    f"{2 * (u + quantum)}"
                )


def test_backlogged_clients_share_equally_whatever_their_request_sizes():
    """Three clients always backlogged, with small, medium and large requests: each gets
    about a third of the service (FCFS would give the large one most)."""
    sizes = {"s": (4, 4), "m": (8, 16), "l": (16, 40)}
    arrivals = [Arrival(0.0, c, *sizes[c]) for c in sizes for _ in range(120)]
    _, steps, _ = drive(DRR(16.0), arrivals, kv_tokens=120)
    busy = [s for s in steps if s.backlogged == set(sizes)]
    total = {c: sum(s.service.get(c, 0.0) for s in busy) for c in sizes}
    mean = sum(total.values()) / 3
    assert all(abs(v - mean) <= 0.15 * mean for v in total.values()), (
        f"service of small, medium and large: {total}, not within 15% of a third each"
    )


@pytest.mark.parametrize("name", ["overload", "on_off_overload", "real"])
def test_on_the_papers_workloads_as_fair_as_vtc_and_as_fast(name):
    """On the paper's workloads DRR is as fair as VTC (within 10%) and as fast."""
    w = workload(name)
    trace = w.make()
    table = {}
    for policy in ("fcfs", "vtc", DRR()):
        r = simulate(trace, policy)
        table[getattr(policy, "name", policy)] = metrics.table_metrics(
            r.served, r.total_time, horizon=w.duration
        )
    drr, vtc, fcfs = table["drr:256"], table["vtc"], table["fcfs"]
    assert drr.max_diff <= 1.1 * vtc.max_diff and drr.avg_diff <= 1.1 * vtc.avg_diff, (
        f"{name}: Max / Avg Diff {drr.max_diff:.1f} / {drr.avg_diff:.1f}, VTC's "
        f"{vtc.max_diff:.1f} / {vtc.avg_diff:.1f}: more than 10% above"
    )
    assert drr.avg_diff < 0.7 * fcfs.avg_diff, f"{name}: Avg Diff not 30% below FCFS's"
    assert drr.throughput >= 0.98 * vtc.throughput, f"{name}: throughput 2% below VTC's"
