"""VTC (Algorithm 2), its selection structure and the artifact's variant, through the hooks the
engine calls: no model and no engine, except where a test drives the real step loop.

`LeastCounter` (the lazy heap) is checked against `LinearScan` (the obvious scan) after every
operation of random sequences; forgetting idle clients is checked to change no decision by
running the same sequence with and without it; each of the artifact's three deviations is shown
beside Algorithm 2's own behaviour. The theorems, which need whole workloads, are
`test_scheduler.py`'s.
"""

from __future__ import annotations

import random
import re

import pytest

from minivtc.course.graded.driver import Arrival, drive
from minivtc.engine.sampler import SamplingParams
from minivtc.fairness import scheduler as scheduler_module
from minivtc.fairness import vtc as vtc_module
from minivtc.fairness.artifact import ArtifactVTC
from minivtc.fairness.cost import LinearCost, ProfiledCost
from minivtc.fairness.fairness_check import FairnessCheck
from minivtc.fairness.least_counter import LeastCounter, LinearScan
from minivtc.fairness.policies import make_scheduler
from minivtc.fairness.predictors import MeanOfLast, MovingAverage, Oracle
from minivtc.fairness.scheduler import admission_round
from minivtc.fairness.vtc import VTC
from minivtc.requests.request import Request

W_P, W_Q = 1.0, 2.0  # the paper's weights
CLIENTS = [f"c{i}" for i in range(5)]


def request(rid: str, client: str, n_p: int = 1, n_q: int = 4) -> Request:
    return Request(rid, client, [1] * n_p, SamplingParams(max_tokens=n_q), 0.0)


def admit_all(vtc):
    """Everything fits (the round's `fits`): every peeked request is dispatched."""
    return lambda r: True


def admit_some(vtc, n: int):
    """Admit `n` requests, then report a misfit (the round stops there)."""
    left = [n]

    def admit(r) -> bool:
        left[0] -= 1
        return left[0] >= 0 and True

    return admit


def agrees_with_linear_scan(vtc) -> None:
    """The heap's pick is the reference scan's over the same dicts, and its own checks hold."""
    scan = LinearScan(vtc.counters, vtc.first_seen, vtc.queues)
    assert vtc.least.least() == scan.least()
    vtc.least.check()


# --- LeastCounter: the waiting client with the smallest counter ---------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_least_counter_picks_as_linear_scan_under_random_operations(seed):
    """400 random operations: arrivals, charges, refunds (which lower a counter below its heap
    key), scheduling rounds, removals of waiting requests, and forgetting idle clients."""
    rng = random.Random(seed)
    vtc = VTC(lift=seed % 3 != 0)  # a third of the runs are LCF (no lift)
    ops = ["add"] * 3 + ["charge"] * 2 + ["refund"] * 3 + ["schedule"] * 2 + ["remove", "forget"]
    ops += ["nudge"] * 3  # a small refund to the highest waiting counter: buried stale entries
    for i in range(400):
        op = rng.choice(ops)
        waiting = [c for c, q in vtc.queues.items() if q]
        if op == "add":
            vtc.add(request(f"r{i}", rng.choice(CLIENTS), rng.randint(1, 9)), 0.0)
        elif op in ("charge", "refund") and vtc.counters:
            amount = rng.uniform(0, 5) * (1 if op == "charge" else -1)
            vtc.charge(rng.choice(sorted(vtc.counters)), amount)
        elif op == "nudge" and waiting:
            vtc.charge(max(waiting, key=vtc.counters.__getitem__), -0.01)
        elif op == "schedule":
            admission_round(vtc, admit_some(vtc, rng.randint(0, 3)))
        elif op == "remove" and waiting:
            vtc.remove(rng.choice(list(vtc.waiting())))
        elif op == "forget":
            vtc.ledger.forget([c for c in vtc.counters if not vtc.queues[c]], 0.0)
        agrees_with_linear_scan(vtc)


def test_the_heap_stays_within_a_few_times_the_clients():
    """Every refund to a waiting client pushes a new entry and buries the old one; compaction
    keeps the heap small, and the pick stays right through it."""
    vtc = VTC()
    for client in ("low", "mid", "high"):
        vtc.add(request(client, client), 0.0)
    vtc.charge("mid", 50.0)
    vtc.charge("high", 100.0)
    for _ in range(500):
        vtc.charge("high", -0.01)  # stays the highest: its stale entries are never at the top
        agrees_with_linear_scan(vtc)
        assert len(vtc.least.heap) <= max(64, 4 * len(vtc.queues)) + 1


@pytest.mark.parametrize("kind", [LeastCounter, LinearScan])
def test_ties_go_to_the_client_seen_first(kind):
    class Zero(VTC):
        Least = kind

    vtc = Zero(cost=lambda n_p, n_q: 0.0)  # every counter stays 0: every pick is a tie
    vtc.add(request("b1", "b"), 0.0)
    admission_round(vtc, admit_all(vtc))  # b is seen first, then leaves Q
    for rid, client in [("a1", "a"), ("c1", "c"), ("b2", "b"), ("a2", "a")]:
        vtc.add(request(rid, client), 0.0)
    order = []
    admission_round(vtc, lambda r: order.append(r.request_id) or True)
    assert order == ["b2", "a1", "a2", "c1"]  # by first sight: not by name, nor by rejoining


def test_a_forgotten_client_gets_a_fresh_heap_entry():
    """Versions are never reused: an entry made before a client was forgotten stays dead after
    it returns, and the returning client is found by its new entry."""
    vtc = VTC()
    vtc.add(request("y1", "y"), 0.0)
    vtc.charge("y", 5.0)
    vtc.add(request("x1", "x"), 0.0)  # lifted to y's 5
    vtc.charge("x", -3.0)  # a refund: a new entry, the old one (key 5) dead and buried under y's
    vtc.remove(vtc.queues["x"][0])
    vtc.add(request("z1", "z"), 0.0)
    vtc.remove(vtc.queues["z"][0])  # z leaves last, so x (2 <= the floor 5) may be forgotten
    assert vtc.least.least() == "y"
    old = [e for e in vtc.least.heap if e[3] == "x"]
    assert old, "the test needs a stale entry of x still in the heap"
    assert vtc.ledger.forget(["x"], 0.0) == ["x"] and "x" not in vtc.least.versions
    vtc.add(request("x2", "x"), 0.0)  # back at the floor, 5: its old key again
    live = [e for e in vtc.least.heap if e[3] == "x" and vtc.least.is_live(e[2], "x")]
    assert len(live) == 1 and live[0][2] > max(e[2] for e in old)
    assert not any(vtc.least.is_live(e[2], "x") for e in old)
    agrees_with_linear_scan(vtc)


def test_heap_selection_equals_brute_force_scan():
    rng = random.Random(0)
    for trial in range(30):
        vtc = VTC(lift=rng.random() < 0.5)
        reqs = []
        for i in range(200):
            op = rng.random()
            if op < 0.5:
                r = Request(
                    f"r{trial}-{i}",
                    f"c{rng.randint(0, 9)}",
                    [1] * rng.randint(1, 9),
                    SamplingParams(max_tokens=4),
                    0.0,
                )
                vtc.add(r, 0.0)
                reqs.append(r)
            elif op < 0.8 and reqs:
                r = rng.choice(reqs)
                r.output_ids.append(1)
                # Mostly charges; sometimes a refund, which lowers a counter below its heap key.
                vtc.charge(
                    r.client_id, rng.uniform(-3, 5) if rng.random() < 0.2 else rng.uniform(0, 5)
                )
            else:
                budget = [rng.randint(0, 3)]

                def admit(r, budget=budget, vtc=vtc):
                    budget[0] -= 1
                    if budget[0] < 0:
                        return False
                    return True

                admission_round(vtc, admit)
            waiting = [c for c, q in vtc.queues.items() if q]
            brute = min(waiting, key=lambda c: (vtc.counters[c], vtc.first_seen[c]), default=None)
            assert vtc.least.least() == brute
            vtc.check_invariants()


# --- what VTC charges, and when -----------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["vtc", "vtc-artifact", "vtc-predict", "vtc-oracle:0.5", "vtc-profile", "lcf"]
)
def test_on_decode_of_a_batch_charges_exactly_as_one_call_per_request(name):
    """The engine's per-step hook (one call for the batch) equals one call per request."""
    rng = random.Random(1)
    batched, plain = make_scheduler(name, seed=3), make_scheduler(name, seed=3)
    twins = []
    for i in range(40):
        client, n_p, n_q = f"c{rng.randint(0, 4)}", rng.randint(1, 30), rng.randint(1, 12)
        pair = [
            Request(f"r{i}", client, [1] * n_p, SamplingParams(max_tokens=n_q), 0.0)
            for _ in (batched, plain)
        ]
        for vtc, r in zip((batched, plain), pair, strict=True):
            vtc.add(r, 0.0)
            admission_round(vtc, lambda req, vtc=vtc: True)
        twins.append(pair)
    while twins:
        for pair in twins:
            for r in pair:
                r.output_ids.append(1)
        batched.on_decode([a for a, _ in twins])
        for _, b in twins:
            plain.on_decode([b])
        for pair in [p for p in twins if p[0].num_output == p[0].params.max_tokens]:
            twins.remove(pair)
            for vtc, r in zip((batched, plain), pair, strict=True):
                r.finish_reason = "length"
                vtc.on_finish(r)
        assert batched.counters == plain.counters


def finished(vtc, client, n_p, n_q, rid="x"):
    """Run one request through the hooks as the engine would: dispatch, n_q tokens, finish."""
    r = Request(rid, client, [1] * n_p, SamplingParams(max_tokens=n_q), 0.0)
    vtc.add(r, 0.0)
    admission_round(vtc, lambda req: True)
    for _ in range(n_q):
        r.output_ids.append(1)
        vtc.on_decode([r])
    r.finish_reason = "length"
    vtc.on_finish(r)
    return r


@pytest.mark.parametrize("cost", [LinearCost(), ProfiledCost()])
@pytest.mark.parametrize(
    "predictor", [None, MeanOfLast(), MovingAverage(), Oracle(), Oracle(0.5, seed=1)]
)
def test_total_charge_is_the_cost_whatever_the_prediction(cost, predictor):
    """Charges are incremental (h(n_p, n_q) - h(n_p, n_q - 1)), over-prediction is refunded:
    a finished request has cost exactly h(n_p, n_q) in the end."""
    vtc = VTC(cost=cost, predictor=predictor)
    total = 0.0
    for i, (n_p, n_q) in enumerate([(10, 30), (5, 50), (20, 3), (7, 7), (1, 100)]):
        finished(vtc, "a", n_p, n_q, rid=f"r{i}")
        total += cost(n_p, n_q)
        assert vtc.counters["a"] == pytest.approx(total)


def test_prediction_is_charged_at_dispatch():
    vtc = VTC(predictor=Oracle())
    r = Request("x", "a", [1] * 10, SamplingParams(max_tokens=40), 0.0)
    vtc.add(r, 0.0)
    admission_round(vtc, lambda req: True)
    assert vtc.counters["a"] == W_P * 10 + W_Q * 40  # the whole cost up front (the oracle)


def test_lift_rules():
    vtc = VTC()
    finished(vtc, "a", 10, 10, rid="a1")  # a's counter: 30; a left Q last
    b = Request("b1", "b", [1], SamplingParams(), 0.0)
    vtc.add(b, 0.0)  # Q empty: b is lifted to the last client that left Q
    assert vtc.counters["b"] == 30
    c = Request("c1", "c", [1], SamplingParams(), 0.0)
    vtc.add(c, 0.0)  # Q = {b}: c is lifted to the minimum waiting counter
    assert vtc.counters["c"] == 30
    artifact = ArtifactVTC()
    finished(artifact, "a", 10, 10)
    artifact.add(Request("b1", "b", [1], SamplingParams(), 0.0), 0.0)
    assert artifact.counters["b"] == 0  # the artifact only lifts against waiting clients
    lcf = VTC(lift=False)
    finished(lcf, "a", 10, 10)
    lcf.add(Request("b1", "b", [1], SamplingParams(), 0.0), 0.0)
    assert lcf.counters["b"] == 0


def test_artifact_leaves_the_first_token_uncharged_and_charges_finish_events():
    vtc = make_scheduler("vtc", artifact=True)
    finished(vtc, "a", 10, 10)
    assert vtc.counters["a"] == W_P * 10 + W_Q * 9 + W_Q  # no first token; +1 at finish


def test_finish_events_charge_the_whole_batch_once_per_step():
    """The artifact's finish charge through the real engine: two requests finish in one step,
    a third runs on (and each request's first token is free)."""
    vtc = ArtifactVTC()
    arrivals = [Arrival(0.0, "a", 5, 4), Arrival(0.0, "b", 5, 4), Arrival(0.0, "c", 5, 8)]
    engine, _, _ = drive(vtc, arrivals, kv_tokens=100)
    # Finish events at step 4 (a and b together: one event) and step 8 (c): a and b get one
    # extra w_q, c two.
    assert vtc.counters["a"] == W_P * 5 + W_Q * 3 + W_Q
    assert vtc.counters["c"] == W_P * 5 + W_Q * 7 + 2 * W_Q


# --- the artifact's three deviations, each beside Algorithm 2 -----------------------------------


@pytest.mark.parametrize("kind, lifts_to_last_left", [(VTC, True), (ArtifactVTC, False)])
def test_only_algorithm_2_lifts_a_client_joining_an_empty_queue(kind, lifts_to_last_left):
    vtc = kind()
    finished(vtc, "a", 10, 10)  # Q is empty again; a left it last, at 30
    vtc.add(request("b1", "b"), 0.0)
    assert vtc.counters["b"] == (vtc.counters["a"] if lifts_to_last_left else 0.0)
    vtc.charge("b", 5.0)
    vtc.add(request("c1", "c"), 0.0)
    assert vtc.counters["c"] == vtc.counters["b"]  # both lift to the smallest waiting counter


@pytest.mark.parametrize("kind, first_token_charged", [(VTC, True), (ArtifactVTC, False)])
def test_only_algorithm_2_charges_the_first_output_token(kind, first_token_charged):
    vtc = kind()
    r = request("r", "a", n_p=10, n_q=5)
    vtc.add(r, 0.0)
    admission_round(vtc, admit_all(vtc))
    assert vtc.counters["a"] == W_P * 10
    r.output_ids.append(1)
    vtc.on_decode([r])
    assert vtc.counters["a"] == W_P * 10 + (W_Q if first_token_charged else 0.0)
    r.output_ids.append(1)
    vtc.on_decode([r])  # every later token costs w_q under both
    assert vtc.counters["a"] == W_P * 10 + W_Q * (2 if first_token_charged else 1)


@pytest.mark.parametrize("kind, finish_charge", [(VTC, 0.0), (ArtifactVTC, W_Q)])
def test_only_the_artifact_charges_the_batch_once_per_step_with_a_finish(kind, finish_charge):
    """a and b finish together at step 2, c alone at step 4: the artifact charges each request
    of the step's batch one more output token per step with a finish, not per finish."""
    vtc = kind()
    batch = [request(f"r{c}", c, n_p=3, n_q=n_q) for c, n_q in (("a", 2), ("b", 2), ("c", 4))]
    for r in batch:
        vtc.add(r, 0.0)
    admission_round(vtc, admit_all(vtc))
    for step in range(1, 5):
        running = [r for r in batch if r.finish_reason is None]
        for r in running:
            r.output_ids.append(1)
        vtc.on_decode(running)
        before = dict(vtc.counters)
        done = [r for r in running if r.num_output == r.params.max_tokens]
        assert len(done) == {1: 0, 2: 2, 3: 0, 4: 1}[step]
        for r in done:
            r.finish_reason = "length"
            vtc.on_finish(r)
        charged = {r.client_id for r in running} if done else set()
        assert vtc.counters == {c: n + finish_charge * (c in charged) for c, n in before.items()}
    first_token = 0.0 if kind is ArtifactVTC else W_Q
    assert vtc.counters["c"] == W_P * 3 + first_token + W_Q * 3 + 2 * finish_charge


# --- forgetting idle clients ---------------------------------------------------------------------


def forget_setup(vtc) -> list[str]:
    """One client of each kind the rule tells apart, and one it never saw. Returns them all."""
    for client in ("above", "gone", "waiting", "last"):
        vtc.add(request(f"{client}1", client, n_p=10), 0.0)
    admission_round(vtc, admit_some(vtc, 1))  # "above" is dispatched: charged 10, over the floor 0
    vtc.remove(vtc.queues["gone"][0])  # idle at 0
    vtc.remove(vtc.queues["last"][0])  # idle at 0, and the last to leave Q
    return ["above", "gone", "waiting", "last", "never-seen"]


def test_forget_drops_only_an_idle_client_at_or_below_the_floor():
    vtc = VTC()
    clients = forget_setup(vtc)
    assert vtc.lift_floor() == 0.0 and vtc.counters["above"] == 10
    assert vtc.ledger.forget(clients, 0.0) == ["gone"]
    assert "gone" not in vtc.counters and "gone" not in vtc.queues
    assert vtc.first_seen["gone"] == 1  # its place among ties is kept
    assert {"above", "waiting", "last"} <= set(vtc.counters)


@pytest.mark.parametrize(
    "make",
    [lambda: VTC(lift=False), lambda: VTC(predictor=MeanOfLast()), ArtifactVTC],
    ids=["lcf", "predictor", "artifact"],
)
def test_forget_drops_nothing_without_a_floor_that_never_falls(make):
    """LCF has no floor; a predictor's refunds can lower one; the artifact's empty Q has none."""
    vtc = make()
    assert vtc.ledger.forget(forget_setup(vtc), 0.0) == []


def hook_run(vtc, plan, forgetful: bool) -> tuple[list[str], int]:
    """Replay `plan` (per step, the arrivals) through the hooks as the engine would, with at
    most 3 running; `forgetful`: forget every idle client after every step. Returns the
    dispatch order and how many clients were forgotten."""
    running, order, forgotten = [], [], 0

    def admit(r) -> bool:
        if len(running) >= 3:
            return False
        running.append(r)
        order.append(r.request_id)
        return True

    for arrivals in plan:
        for rid, client, n_p, n_q in arrivals:
            vtc.add(request(rid, client, n_p, n_q), 0.0)
        admission_round(vtc, admit)
        for r in running:
            r.output_ids.append(1)
        vtc.on_decode(running)
        for r in [r for r in running if r.num_output == r.params.max_tokens]:
            r.finish_reason = "length"
            running.remove(r)
            vtc.on_finish(r)
        if forgetful:
            busy = {r.client_id for r in running} | {r.client_id for r in vtc.waiting()}
            forgotten += len(vtc.ledger.forget([c for c in vtc.counters if c not in busy], 0.0))
    return order, forgotten


@pytest.mark.parametrize(
    "make",
    [VTC, lambda: VTC(cost=ProfiledCost()), lambda: VTC(weights={"c1": 2, "c3": 0.5})],
    ids=["linear", "profiled", "weighted"],
)
def test_forgetting_idle_clients_changes_no_decision(make):
    """VTCLedger.forget's argument, checked: the same arrivals with and without forgetting give the
    same dispatches, and every client still known has the same counter."""
    rng = random.Random(7)
    clients = [f"c{i}" for i in range(12)]
    plan = [
        [
            (f"r{t}-{k}", rng.choice(clients), rng.randint(1, 20), rng.randint(1, 6))
            for k in range(rng.choice([0, 0, 1, 1, 2]))
        ]
        for t in range(400)
    ]
    kept, forgetful = make(), make()
    order, _ = hook_run(kept, plan, forgetful=False)
    forgetful_order, forgotten = hook_run(forgetful, plan, forgetful=True)
    assert forgotten > 20, "the test must actually forget clients"
    assert forgetful_order == order
    assert all(forgetful.counters[c] == kept.counters[c] for c in forgetful.counters)


# --- the rest of Algorithm 2's bookkeeping -------------------------------------------------------


def test_lemma_4_3_is_checked_against_u_in_counter_units():
    vtc = VTC(weights={"a": 0.5, "b": 4.0})
    check = FairnessCheck(vtc, 10, 100, 1, reservation="full", preempt_gap=None)
    assert check.bound == max(W_P * 10, W_Q * 100) / 0.5  # a weight below 1 stretches U
    for client in "ab":
        vtc.add(request(f"{client}1", client), 0.0)
    vtc.charge("a", 0.5 * 400)  # a's counter: 400, the bound exactly
    check.check()
    vtc.charge("a", 0.5 * 1)
    with pytest.raises(AssertionError, match="Lemma 4.3 violated"):
        check.check()


def test_an_aborted_request_teaches_the_predictor_nothing():
    vtc = VTC(predictor=MeanOfLast())
    finished(vtc, "a", 5, 8, rid="done")
    r = request("cut", "a", n_p=5, n_q=100)
    vtc.add(r, 0.0)
    admission_round(vtc, admit_all(vtc))
    r.output_ids.append(1)
    vtc.on_decode([r])
    r.finish_reason = "abort"
    vtc.on_finish(r)
    assert list(vtc.predictor.history["a"]) == [8]


# --- the module docstring's map of Algorithm 2 ---------------------------------------------------


def algorithm_2_methods() -> list[str]:
    """The method at the end of each line of the docstring's map: `name()` or `name(...)`."""
    names = re.findall(r"([A-Za-z_][\w.]*)\([^()]*\)[ \t]*$", vtc_module.__doc__, re.M)
    return list(dict.fromkeys(names))


@pytest.mark.parametrize("name", algorithm_2_methods())
def test_the_docstring_maps_algorithm_2_to_methods_that_exist(name):
    owner, _, attr = name.rpartition(".")
    cls = {"": VTC, "LeastCounter": LeastCounter, "scheduler": scheduler_module}[owner]
    assert callable(getattr(cls, attr, None)), f"{cls.__name__} has no method {attr}()"


def test_the_docstring_map_is_read():
    assert len(algorithm_2_methods()) >= 7  # a parse that finds nothing would pass vacuously
