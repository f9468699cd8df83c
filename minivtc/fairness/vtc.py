"""The Virtual Token Counter: Algorithm 2 of the paper, and the official artifact's variant.

Owns: `VTC` (Algorithm 2, weighted (Section 4.3), with length prediction (Algorithm 3), any
cost h (Section 4.2)). The waiting client with the smallest counter is found by
`least_counter.py`; the official artifact's counting is `artifact.py`'s. What other layers read
and correct (counters, accounts, the gateway's corrections) is `VTCLedger`'s, after the class:
`VTC` is Algorithm 2 and nothing else. Lessons 5 and 8.

Algorithm 2, line by line, and the method that does it:

    on arrival of request r from client u:                                  add()
        if Q holds no request of u:                    (u joins the queue)  join()
            c_u <- max(c_u, floor)                                          lift_counter()
            floor, Q not empty: min over clients i in Q of c_i              lift_floor()
            floor, Q empty: c_l, l the last client to leave Q               lift_floor()
              (with fair preemption, Q empty: FairLift's floor instead,     join_floor()
               within the gap of every client that ran while Q was empty)
        Q <- Q + r                                                          add()
    each step, while requests may be admitted:                    scheduler.admission_round()
        k <- the client in Q with the smallest c_k                          LeastCounter.least()
        r <- the earliest request of k in Q                                 peek()
        if r does not fit: stop admitting (never skip to another) scheduler.admission_round()
        c_k <- c_k + h(n_p(r), 0): the prompt, charged at dispatch          dispatch(r)
    after the forward pass: c_i <- c_i + the cost of i's new tokens         on_decode()
    requests that finished leave the batch                                  on_finish()

The counter is the service a client has received (divided by its weight) *plus its lifts*: a
client back from idle is raised to the others' level, so it cannot bank idle time. With full
reservation (the course's proof condition, not the paper's model) and no refunds, the waiting
clients' counters stay within U of each other (Lemma 4.3), U the bound the cost h states
(`cost.spread_bound`): for the linear h, U = max(w_p L_input, w_q M) when w_p <= w_q (the
paper's) and max(w_p L_input, w_q M + (w_p - w_q) min(L_input, M)) when w_p > w_q (ours;
`cost.fairness_bound`, with the proof); the profiled h's is ours too. So two clients
backlogged over an interval receive service within 2U of each other (Theorem 4.4); the
engine's check_fairness asserts Lemma 4.3 after every step and refuses what no stated bound
covers (`fairness_check.py`). `VTC(lift=False)` is LCF, the paper's broken baseline.

The general cost's rule: a request with n_p prompt tokens that has n_q output tokens has
received h(n_p, n_q), so its n_q-th token is charged h(n_p, n_q) - h(n_p, n_q - 1) (w_q for the
linear h). With a predictor, h(n_p, predicted) is charged at dispatch, nothing more until n_q
passes the prediction, and the over-prediction is refunded at the end (Algorithm 3).

A preempted request goes back to the head of its client's queue, nothing charged or refunded
(`requeue`). Fair preemption's extension of the lift (the paper's Appendix C.3 asks for it;
Lesson 11) is not Algorithm 2's and is not `VTC`'s: it is a strategy object the engine installs
(`VTCLedger.set_preempt_gap`), `fair_lift.FairLift`, which VTC consults when a client joins an
empty Q and tells who ran meanwhile. The gateway's corrections (`VTCLedger.settle`, `unadmit`)
keep the lift's promise for refunds: a counter is never lowered below the smallest waiting one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from minivtc.fairness.cost import PAPER_COST, Cost, cache_discount, check_cached_weight, weights_of
from minivtc.fairness.fair_lift import FairLift
from minivtc.fairness.least_counter import LeastCounter
from minivtc.fairness.ledger import Ledger
from minivtc.fairness.predictors import Predictor
from minivtc.fairness.scheduler import Scheduler
from minivtc.requests.request import Request

__all__ = ["LeastCounter", "VTC", "VTCLedger"]


class VTC(Scheduler):
    """The Virtual Token Counter (Algorithm 2, mapped in the module docstring). `weights`:
    operator-set shares; `predictor`: Algorithm 3; `cost`: h; `lift=False`: LCF;
    `cached_weight`: w_c (`cost.cache_discount`). Ties go to the client seen first."""

    Least = LeastCounter  # the selection structure (`LinearScan` in the reference tests)

    def __init__(
        self,
        cost: Cost = PAPER_COST,
        weights: dict[str, float] | None = None,
        lift: bool = True,
        predictor: Predictor | None = None,
        name: str = "vtc",
        cached_weight: float | None = None,
    ) -> None:
        check_cached_weight(cost, cached_weight)
        self.cost, self.weights, self.cached_weight = cost, dict(weights or {}), cached_weight
        self.lift, self.predictor, self.name = lift, predictor, name
        self.counters: dict[str, float] = {}
        self.queues: dict[str, deque[Request]] = {}  # Q, per client: its waiting requests
        self.first_seen: dict[str, int] = {}  # tie order (kept for forgotten clients too)
        self.least = self.Least(self.counters, self.first_seen, self.queues)
        self.last_left: str | None = None  # the last client whose queue emptied
        self.charged: dict[str, tuple[float, float]] = {}  # id -> (q, h(n_p, q)) charged for
        self.fair_lift: FairLift | None = None  # fair preemption's (`VTCLedger.set_preempt_gap`)
        self.ledger = VTCLedger(self)  # the books other layers read and correct

    def add(self, request: Request, now: float) -> str | None:
        client = request.client_id
        self.meet(client)
        if self.queues[client]:
            self.queues[client].append(request)
        else:
            self.join(request)
        return None

    def peek(self) -> Request | None:
        """The earliest request of the waiting client with the smallest counter."""
        client = self.least.least()
        return None if client is None else self.queues[client][0]

    def dispatch(self, request: Request) -> None:
        """Algorithm 2's c_k <- c_k + h(n_p, 0) (with a predictor h(n_p, predicted), Algorithm
        3; a cached prompt token at w_c), now: before the next pick, or the same client would
        stay the minimum and take the whole round. Back from a preemption: charged already.
        `charged[request_id] = (predicted, h(n_p, predicted))` records the prediction (0.0
        without a predictor; never rounded) and h, not h less the cache's discount:
        `charge_outputs` and `on_finish` count from h. A client whose queue empties becomes
        `last_left`, the floor of the next client to join an empty Q (as in `remove`)."""
        queue = self.queues[request.client_id]
        assert queue[0] is request, "dispatch takes the request peek offered"
        if not request.num_preemptions:
            predicted = self.predictor.predict(request) if self.predictor else 0.0
            service = self.cost(request.num_prompt, predicted)
            self.charged[request.request_id] = (predicted, service)
            discount = cache_discount(self.cost, self.cached_weight, request.num_cached)
            self.charge(request.client_id, service - discount)
        queue.popleft()
        if not queue:
            self.last_left = request.client_id

    def on_decode(self, requests: list[Request]) -> None:
        """One step's tokens: each request's new output charged to its own client, once
        (`charge_outputs`); with fair preemption, while Q is empty, its lift is told who ran
        (`FairLift.ran`: Lesson 11)."""
        self.charge_outputs(requests)
        if self.fair_lift is not None and self.least.least() is None:
            self.fair_lift.ran(requests)

    def on_finish(self, request: Request) -> None:
        """Refund output charged but never generated (Algorithm 3); teach the predictor. A
        request whose prediction q exceeds its n_q output tokens is charged h(n_p, n_q) - h(n_p,
        q), a negative amount, through `charge`, not the ledger's `lower`: the refund is not
        stopped at the smallest waiting counter, so it can break Lemma 4.3 (Lesson 8). A request
        never dispatched has no record and gets nothing. The predictor observes every finished
        request but an aborted one (`finish_reason == "abort"`)."""
        q, service = self.charged.pop(request.request_id, (0.0, 0.0))
        if q > request.num_output:  # refund the over-prediction (Algorithm 3)
            now = self.cost(request.num_prompt, request.num_output)
            self.charge(request.client_id, now - service)
        if self.predictor is not None and request.finish_reason != "abort":
            self.predictor.observe(request)

    def requeue(self, request: Request) -> None:
        """Preempted: first of its client's queue, joining Q lifted if it was empty (not
        backlogged throughout: Definition 4.1). Nothing is charged or refunded."""
        if self.queues[request.client_id]:
            self.queues[request.client_id].appendleft(request)
        else:
            self.join(request)

    def remove(self, request: Request) -> None:
        queue = self.queues[request.client_id]
        queue.remove(request)
        if not queue:
            self.last_left = request.client_id

    def waiting(self) -> Iterator[Request]:
        return (r for q in self.queues.values() for r in q)

    def check_invariants(self) -> None:
        self.least.check()  # Lemma 4.3 itself is checked by `fairness_check.FairnessCheck`

    def meet(self, client: str) -> None:
        """A client new, or forgotten (a forgotten counter was <= the floor): counter 0."""
        if client not in self.counters:
            self.counters[client] = 0.0
            self.first_seen.setdefault(client, len(self.first_seen))
            self.queues[client] = deque()

    def join(self, request: Request) -> None:
        """`request`'s client, with nothing waiting, joins Q with it: lifted, then selectable."""
        if self.lift:
            self.lift_counter(request.client_id)
        if self.fair_lift is not None:
            self.fair_lift.reset()  # Q is empty no longer
        self.queues[request.client_id].append(request)
        self.least.push(request.client_id)

    def lift_counter(self, client: str) -> None:
        """A client joining the queue is lifted so it cannot bank idle time (Lemma 4.3).
        Without the lift (LCF) a client back from idle holds a stale low counter and takes
        every dispatch until it catches up: the 2U bound fails for the others."""
        floor = self.join_floor()
        if floor is not None and floor > self.counters[client]:
            self.counters[client] = floor

    def join_floor(self) -> float | None:
        """Algorithm 2's floor; with fair preemption, when Q is empty, `FairLift`'s."""
        floor = self.lift_floor()
        if self.fair_lift is None or self.least.least() is not None:
            return floor
        return self.fair_lift.floor(self.counters, floor)

    def lift_floor(self) -> float | None:
        """The smallest waiting counter; Q empty: the counter of the last client to leave Q."""
        client = self.least.least()
        client = self.last_left if client is None else client
        return None if client is None else self.counters[client]

    def charge(self, client: str, amount: float) -> None:
        self.counters[client] += amount / self.weights.get(client, 1.0)
        if amount < 0 and self.queues[client]:
            self.least.push(client)  # the live entry's key is now too high to be a lower bound

    def charge_outputs(self, requests: list[Request]) -> None:
        """Each of `requests` got its n_q-th token: charge h(n_p, n_q) - h(n_p, q), q the tokens
        charged for so far (at first the prediction: nothing until n_q passes it)."""
        # PERF: once per token, the simulator's hottest loop: charge() inlined, len() not properties
        charged, counters, weights, cost = self.charged, self.counters, self.weights, self.cost
        for request in requests:
            n_q = len(request.output_ids)
            q, service = charged[request.request_id]  # made at dispatch
            if n_q <= q:
                continue  # still within the prediction charged at dispatch
            now = cost(len(request.prompt_ids), n_q)
            charged[request.request_id] = (n_q, now)
            counters[request.client_id] += (now - service) / weights.get(request.client_id, 1.0)


class VTCLedger(Ledger):
    """VTC's books (`ledger.py`): its counters read, and corrected without breaking the lift's
    promise, a counter never lowered below the smallest waiting one (Lemma 4.3 holds)."""

    keeps_counters = True

    def __init__(self, vtc: VTC) -> None:
        self.vtc = vtc

    def counter(self, client: str) -> float | None:
        return self.vtc.counters.get(client)

    def waiting_counters(self) -> list[float]:
        return [self.vtc.counters[c] for c, q in self.vtc.queues.items() if q]

    def accounts(self) -> dict[str, tuple[float | None, float]]:
        weights = self.vtc.weights
        return {c: (n, weights.get(c, 1.0)) for c, n in self.vtc.counters.items()}

    def client_weights(self) -> dict[str, float]:
        return dict(self.vtc.weights)

    def refunds(self) -> bool:
        return self.vtc.predictor is not None  # Algorithm 3 refunds an over-prediction

    def dispatch_charge(self, request: Request) -> float:
        """What `dispatch` charged `request`'s client, in counter units (0: none recorded)."""
        _, service = self.vtc.charged.get(request.request_id, (0.0, 0.0))
        return service / self.vtc.weights.get(request.client_id, 1.0)

    def gap_bound(self, u: float) -> float | None:
        return 2 * u  # Theorem 4.4

    def settle(self, request: Request, num_prompt: int, num_output: int) -> None:
        """Charge `request` as h(num_prompt, num_output), what it truly cost, in place of what
        was charged (an estimate); a correction downwards stops at the lift floor (`lower`).
        Call before `on_finish`, with `request.output_ids` `num_output` long (else on_finish
        refunds the difference, as for an over-prediction)."""
        charged = self.vtc.charged
        if request.request_id not in charged:
            return
        _, before = charged[request.request_id]
        actual = self.vtc.cost(num_prompt, num_output)
        charged[request.request_id] = (float(num_output), actual)
        self.lower(request.client_id, before - actual)

    def unadmit(self, request: Request) -> None:
        """Refund what `dispatch` charged, no lower than the smallest waiting counter (as
        `lower`); the caller requeues it, as if never dispatched (joining an empty Q, it is
        lifted to the floor then)."""
        _, service = self.vtc.charged.pop(request.request_id, (0.0, 0.0))
        self.lower(request.client_id, service)

    def adopt(self, counters: dict[str, float]) -> None:
        """Set the given clients' counters (a client not seen yet is met first). A counter that
        fell gets a new heap entry, as a refund's does; one that rose needs none (the heap's
        keys are lower bounds, re-keyed when they reach the top: `least_counter.py`)."""
        vtc = self.vtc
        for client, counter in counters.items():
            vtc.meet(client)
            fell = counter < vtc.counters[client]
            vtc.counters[client] = counter
            if fell and vtc.queues[client]:
                vtc.least.push(client)

    def forget(self, idle: list[str], now: float) -> list[str]:
        """Forget idle clients whose counter is at or below the lift floor F: no decision
        changes. Kept, such a client rejoins at max(counter, F') where F' >= F is the floor
        then (F never falls: charges raise counters, a joining client is lifted to F, a
        leaving one leaves a larger minimum); forgotten, it rejoins at max(0, F') = F' -- the
        same counter, and its place among ties (`first_seen`) is kept. Needs the lift (LCF has
        no floor) and no refunds (Algorithm 3's refund lowers counters, so F could fall)."""
        vtc = self.vtc
        floor = vtc.lift_floor()
        if not vtc.lift or vtc.predictor is not None or floor is None:
            return []
        counters, queues = vtc.counters, vtc.queues
        gone = [
            c
            for c in idle
            if c in counters and not queues[c] and c != vtc.last_left and counters[c] <= floor
        ]
        for c in gone:
            del counters[c], queues[c]
            vtc.least.forget(c)
            if vtc.fair_lift is not None:
                vtc.fair_lift.forget(c)
        return gone

    def set_preempt_gap(self, gap: float | None, pool_tokens: int) -> float:
        """Fair preemption (`fair_lift.py`); default gap w_q M / 4, a quarter of Lemma 4.3's M."""
        default = weights_of(self.vtc.cost)[1] * pool_tokens / 4
        self.vtc.fair_lift = FairLift(default if gap is None else gap)
        return self.vtc.fair_lift.gap

    def lower(self, client: str, amount: float) -> None:
        """Take `amount` of service off `client`'s counter (a negative amount adds it), but no
        lower than the smallest waiting counter: a refund cannot let a client bank service it
        never received below the others' level (the lift's reason; Lemma 4.3 holds)."""
        vtc = self.vtc
        floor = vtc.lift_floor() if vtc.least.least() is not None else None
        vtc.charge(client, -amount)
        counter = vtc.counters[client]
        if floor is not None and counter < floor:
            vtc.charge(client, (floor - counter) * vtc.weights.get(client, 1.0))
