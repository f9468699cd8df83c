"""The Virtual Token Counter: Algorithm 2 of the paper, and the official artifact's variant.

Owns: `VTC` (Algorithm 2, weighted (Section 4.3), with length prediction (Algorithm 3), any
cost h (Section 4.2)). The waiting client with the smallest counter is found by
`least_counter.py`; the official artifact's counting is `artifact.py`'s. Lessons 5 and 7.

Algorithm 2, line by line, and the method that does it:

    on arrival of request r from client u:                                  add()
        if Q holds no request of u:                    (u joins the queue)
            c_u <- max(c_u, min over clients i in Q of c_i)                 lift_counter()
            (Q empty: c_u <- max(c_u, c_l), l the last client to leave Q)   lift_floor()
        Q <- Q + r                                                          add()
    each step, while requests may be admitted:                              schedule()
        k <- the client in Q with the smallest c_k                          LeastCounter.least()
        r <- the earliest request of k in Q                                 schedule()
        if r does not fit in memory: stop admitting (never skip to another) schedule()
        c_k <- c_k + h(n_p(r), 0): the prompt, charged at dispatch          on_tokens(r, n_p, 0)
    after the forward pass: c_i <- c_i + the cost of i's new tokens         on_decode()
    requests that finished leave the batch                                  on_finish()

The counter is the service a client has received (divided by its weight) *plus its lifts*: a
client back from idle is raised to the others' level, so it cannot bank idle time. With
U = max(w_p L_input, w_q M) (`cost.fairness_bound`), the waiting clients' counters stay within
U of each other (Lemma 4.3), so two clients backlogged over an interval receive service within
2U of each other (Theorem 4.4); `check_invariants` asserts Lemma 4.3 after every step when the
engine's `check_fairness` is on. `VTC(lift=False)` is LCF, the paper's broken baseline.

The general cost's rule: a request with n_p prompt tokens that has n_q output tokens has
received h(n_p, n_q), so its n_q-th token is charged h(n_p, n_q) - h(n_p, n_q - 1) (w_q for the
linear h). With a predictor, h(n_p, predicted) is charged at dispatch, nothing more until n_q
passes the prediction, and the over-prediction is refunded at the end (Algorithm 3).

Fair preemption (the paper's Appendix C.3 asks for it; Lesson 9), with blocks on demand and the
fair victim (`admission.Fair`): a preempted request goes back to the head of its client's queue,
nothing charged or refunded (`requeue`), and a client joining an empty Q is lifted to within
`gap` of every client that ran since Q emptied (`join_floor`). The waiting counters then stay
within U_P = max(gap, w_p L_input) + w_q B (`cost.preemptive_bound`, its proof and what B is).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from minivtc.core.cost import PAPER_COST, Cost, fairness_bound, weights_of
from minivtc.core.least_counter import LeastCounter
from minivtc.core.predictors import Predictor
from minivtc.core.request import Request
from minivtc.core.scheduler import Admit, Scheduler


class VTC(Scheduler):
    """The Virtual Token Counter (Algorithm 2; the module docstring maps its lines here).

    `weights`: operator-set shares (every charge is divided by the client's weight);
    `predictor`: charge a predicted output length at dispatch (Algorithm 3); `cost`: h;
    `lift=False`: LCF. Ties between equal counters go to the client seen first.
    """

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
        w_p = weights_of(cost)[0]
        if cached_weight is not None and not 0 <= cached_weight <= w_p:
            raise ValueError(f"cached_weight must be in [0, w_p = {w_p}], got {cached_weight}")
        self.cost, self.weights = cost, dict(weights or {})
        self.cached_weight = cached_weight  # w_c for a cached prompt token (`cache_discount`)
        self.lift, self.predictor, self.name = lift, predictor, name
        self.counters: dict[str, float] = {}
        self.queues: dict[str, deque[Request]] = {}  # Q, per client: its waiting requests
        self.first_seen: dict[str, int] = {}  # tie order (kept for forgotten clients too)
        self.least = self.Least(self.counters, self.first_seen, self.queues)
        self.last_left: str | None = None  # the last client whose queue emptied
        # request id -> (q, h(n_p, q)): the output tokens charged for so far (at dispatch, the
        # predicted length) and the service that came to; each new token charges the difference.
        self.charged: dict[str, tuple[float, float]] = {}
        # Fair preemption's gap (`set_preempt_gap`); None: the paper's non-preemptive VTC.
        self.preempt_gap: float | None = None
        self.ran_while_empty: set[str] = set()  # clients charged while Q was empty
        # Checked after every step (the engine's check_fairness: `check_invariants`).
        self.bound: float | None = None
        self.step_gain: dict[str, float] = {}  # client -> its charge in the last step
        self.dispatch_charge, self.step_charge = 0.0, 0.0  # the largest so far

    # --- the hooks the engine calls ------------------------------------------------------------

    def add(self, request: Request, now: float) -> str | None:
        client = request.client_id
        if client not in self.counters:  # new, or forgotten (a forgotten counter was <= floor)
            self.counters[client] = 0.0
            self.first_seen.setdefault(client, len(self.first_seen))
            self.queues[client] = deque()
        if self.queues[client]:
            self.queues[client].append(request)
        else:
            self.join(request)
        return None

    def schedule(self, admit: Admit) -> None:
        """One admission round (Algorithm 2): offer the earliest request of the waiting client
        with the smallest counter to `admit`, until Q is empty or a request does not fit."""
        while (client := self.least.least()) is not None:
            request = self.queues[client][0]
            # Stop the round at the first misfit; never skip to another client. Skipping
            # would let small requests of a high-counter client jump ahead, and the bound's
            # "one dispatch raises the minimum by at most w_p * L_input" would break.
            if not admit(request):  # admit() charges the prompt through on_tokens
                return
            self.queues[client].popleft()
            if not self.queues[client]:
                self.last_left = client

    def on_tokens(self, request: Request, num_prompt: int, num_output: int) -> None:
        """Tokens were processed for a running request: its prompt at dispatch (charge
        h(n_p, predicted), predicted 0 without a predictor), then output tokens."""
        if num_prompt:
            # Charged at dispatch, before the next pick (Algorithm 2): otherwise the same
            # client would stay the minimum and take the whole admission round.
            predicted = self.predictor.predict(request) if self.predictor else 0.0
            service = self.cost(request.num_prompt, predicted)
            weight = self.weights.get(request.client_id, 1.0)
            self.dispatch_charge = max(self.dispatch_charge, service / weight)
            self.charged[request.request_id] = (predicted, service)
            self.charge(request.client_id, service - self.cache_discount(request))
        if num_output:
            self.charge_outputs([request], num_output)

    def on_decode(self, requests: list[Request]) -> None:
        if self.preempt_gap is None:
            self.charge_outputs(requests, 1)
        else:  # the same charge, and what fair preemption's lift and check need to know
            self.charge_step_preemptive(requests)

    def on_finish(self, request: Request) -> None:
        """A request ended: refund what was charged for output it never generated (Algorithm
        3), and tell the predictor how long it really was."""
        q, service = self.charged.pop(request.request_id, (0.0, 0.0))
        if q > request.num_output:  # refund the over-prediction (Algorithm 3)
            refund = service - self.cost(request.num_prompt, request.num_output)
            self.charge(request.client_id, -refund)
        if self.predictor is not None and request.finish_reason != "abort":
            self.predictor.observe(request)

    def requeue(self, request: Request) -> None:
        """Preempted: back to the head of its client's queue; a client with nothing waiting
        joins Q, lifted like any joining client (so not backlogged throughout: Definition 4.1).
        Nothing is charged or refunded: its tokens stay charged, the recompute is waste."""
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

    def accounts(self) -> dict[str, tuple[float | None, float]]:
        return {c: (n, self.weights.get(c, 1.0)) for c, n in self.counters.items()}

    def set_bound(self, max_input: int, pool_tokens: int, max_running: int = 0) -> None:
        """Check the spread of the waiting counters after every step, in counter units
        (divided by the smallest weight below 1): U (Lemma 4.3), or with fair preemption
        `preemptive_bound` (`max_running`: the most requests one client can run at once)."""
        if self.predictor is not None:
            raise ValueError(
                "check_fairness: no bound is stated with a length predictor: a prediction above "
                "the length reached is refunded, lowering a counter after others were lifted to "
                "it, and Lemma 4.3's U can fail (Lesson 7)"
            )
        w_p, w_q = weights_of(self.cost)
        scale = 1.0 / min(min(self.weights.values(), default=1.0), 1.0)
        if self.preempt_gap is None:
            self.bound = fairness_bound(max_input, pool_tokens, w_p, w_q) * scale
        else:
            self.bound = max(self.preempt_gap, w_p * max_input * scale) + w_q * max_running * scale

    def gap_bound(self) -> float | None:
        """The service-gap bound for two backlogged clients that this run guarantees (Theorem
        4.4): 2U, or with fair preemption 2 (max(gap, w_p L_input) + w_q b) with this run's
        largest dispatch and one-step charges; None unless the engine set a bound to check."""
        if self.bound is None:
            return None
        if self.preempt_gap is None:
            return 2 * self.bound
        return 2 * (max(self.preempt_gap, self.dispatch_charge) + self.step_charge)

    def set_preempt_gap(self, gap: float | None, pool_tokens: int) -> float:
        """Default: a quarter of Lemma 4.3's M term, w_q M / 4, so the bound's M term shrinks
        to a quarter (`preemptive_bound`) at the price of some recomputation."""
        if gap is not None and not gap >= 0:  # (nan fails too)
            raise ValueError(f"preempt_gap must be >= 0 (inf: never displace), got {gap}")
        self.preempt_gap = gap if gap is not None else weights_of(self.cost)[1] * pool_tokens / 4
        return self.preempt_gap

    def check_invariants(self) -> None:
        """When the engine set `bound` (check_fairness=True): the waiting counters' spread is
        within U (Lemma 4.3). With fair preemption, within `preemptive_bound` as the run
        stands (its largest dispatch charge and one-step charge so far), and each client that
        ran in the last step at most max(gap, the largest dispatch charge) + its charge in
        that step above the smallest waiting counter: the proof's induction step."""
        self.least.check()
        least = self.check_spread()
        if least is None or self.preempt_gap is None:
            return
        lead = max(self.preempt_gap, self.dispatch_charge)
        for client, gain in self.step_gain.items():
            ahead = self.counters[client] - least
            assert ahead <= lead + gain + 1e-6, (
                f"fair preemption violated: {client!r} ran {ahead:.1f} ahead of the smallest "
                f"waiting counter, more than max(gap, w_p L_input) + its step {lead + gain:.1f}"
            )

    def check_spread(self) -> float | None:
        """The waiting counters' spread is within the bound: U (Lemma 4.3), or with fair
        preemption max(gap, the largest dispatch charge) + the largest one-step charge, as the
        run stands. Returns the smallest waiting counter (None: no bound, or Q empty)."""
        waiting = [self.counters[c] for c, q in self.queues.items() if q]
        if self.bound is None or not waiting:
            return None
        least, spread = min(waiting), max(waiting) - min(waiting)
        if self.preempt_gap is None:
            assert spread <= self.bound + 1e-6, (
                f"Lemma 4.3 violated: waiting counters spread {spread:.1f} > U = {self.bound:.1f}"
            )
            return least
        lead = max(self.preempt_gap, self.dispatch_charge)
        assert spread <= lead + self.step_charge + 1e-6, (
            f"the preemptive bound violated: waiting counters spread {spread:.1f} > max(gap, "
            f"w_p L_input) + w_q b = {lead:.1f} + {self.step_charge:.1f}"
        )
        return least

    def forget(self, idle: list[str], now: float) -> list[str]:
        """Forget idle clients whose counter is at or below the lift floor F: no decision
        changes. Kept, such a client rejoins at max(counter, F') where F' >= F is the floor
        then (F never falls: charges raise counters, a joining client is lifted to F, a leaving
        one leaves a larger minimum); forgotten, it rejoins at max(0, F') = F' -- the same
        counter, and its place among ties (`first_seen`) is kept. Needs the lift (LCF has no
        floor) and no refunds (Algorithm 3's refund lowers counters, so F could fall)."""
        floor = self.lift_floor()
        if not self.lift or self.predictor is not None or floor is None:
            return []
        gone = [
            c
            for c in idle
            if c in self.counters
            and not self.queues[c]
            and c != self.last_left
            and self.counters[c] <= floor
        ]
        for c in gone:
            del self.counters[c], self.queues[c]
            self.least.forget(c)
            self.ran_while_empty.discard(c)
        return gone

    # --- helpers -------------------------------------------------------------------------------

    def join(self, request: Request) -> None:
        """`request`'s client, with nothing waiting, joins Q with it: lifted, then selectable."""
        if self.lift:
            self.lift_counter(request.client_id)
        self.ran_while_empty.clear()  # Q is empty no longer
        self.queues[request.client_id].append(request)
        self.least.push(request.client_id)
        if self.bound is not None:  # a lift too low would widen the spread now, not at a step
            self.check_spread()

    def lift_counter(self, client: str) -> None:
        """A client joining the queue is lifted so it cannot bank idle time (Lemma 4.3).

        Without the lift (LCF) a client back from idle holds a stale low counter and takes
        every dispatch until it catches up: the 2U bound fails for the others.
        """
        floor = self.join_floor()
        if floor is not None and floor > self.counters[client]:
            self.counters[client] = floor

    def join_floor(self) -> float | None:
        """Algorithm 2's floor; with fair preemption, when Q is empty, also within `gap` of
        every client that ran (was charged) since it emptied.

        Those clients were served while nobody waited, and the last to leave Q may lie far
        below them: a client lifted only that far would displace them at once and then take
        every dispatch until it caught up with all they received meanwhile, a lead that only
        the memory they held (M) would limit. The preemptive bound needs it limited by `gap`.
        """
        floor = self.lift_floor()
        if self.preempt_gap is None or self.least.least() is not None or not self.ran_while_empty:
            return floor
        top = max(self.counters[c] for c in self.ran_while_empty) - self.preempt_gap
        return top if floor is None else max(floor, top)

    def lift_floor(self) -> float | None:
        """The smallest waiting counter; Q empty: the counter of the last client to leave Q."""
        client = self.least.least()
        if client is None:
            client = self.last_left
        return None if client is None else self.counters[client]

    def charge_step_preemptive(self, requests: list[Request]) -> None:
        """`on_decode` with fair preemption: charge the step; remember who was charged while
        Q was empty (`join_floor`) and, when checking the bound, each client's charge."""
        clients = {r.client_id for r in requests}
        before = {c: self.counters[c] for c in clients}
        self.charge_outputs(requests, 1)
        if self.least.least() is None:
            self.ran_while_empty |= clients
        if self.bound is not None:  # for check_invariants
            self.step_gain = {c: self.counters[c] - n for c, n in before.items()}
            self.step_charge = max([self.step_charge, *self.step_gain.values()])

    def cache_discount(self, request: Request) -> float:
        """(w_p - w_c) for each prompt token the engine found in the prefix cache (w_c None:
        w_p). Lemma 4.3's U is unchanged: a dispatch still costs at most w_p L_input. The miss
        that fills the cache is paid at w_p by the request that computes it."""
        if self.cached_weight is None:
            return 0.0
        return (weights_of(self.cost)[0] - self.cached_weight) * request.num_cached

    def charge(self, client: str, amount: float) -> None:
        self.counters[client] += amount / self.weights.get(client, 1.0)
        if amount < 0 and self.queues[client]:
            self.least.push(client)  # the live entry's key is now too high to be a lower bound

    def charge_outputs(self, requests: list[Request], num_output: int) -> None:
        """Each of `requests` just got `num_output` tokens, n_q in all: charge its client
        h(n_p, n_q) - h(n_p, q), q being the output tokens already charged for (at first the
        length predicted at dispatch: nothing more is charged until n_q passes it)."""
        # PERF: this loop runs once per generated token, the simulator's hottest code. One cost
        # call per token (h(n_p, q) is remembered in `charged`), charge() inlined (a charge only
        # raises a counter: no heap push), len() rather than properties: -8% instructions in
        # `minivtc bench sim`. `cost.__call__`: Python 3.11 runs a bound method's call inline
        # but calls an instance through C: -2%.
        charged, counters, weights = self.charged, self.counters, self.weights
        cost = self.cost.__call__
        for request in requests:
            n_q = len(request.output_ids)
            q, service = charged[request.request_id]  # made at dispatch (on_tokens)
            if n_q <= q:
                continue  # still within the prediction charged at dispatch
            now = cost(len(request.prompt_ids), n_q)
            charged[request.request_id] = (n_q, now)
            client = request.client_id
            counters[client] += (now - service) / weights.get(client, 1.0)
