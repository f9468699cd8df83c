"""Who runs next: the scheduler interface the engine calls, and the policies side by side.

Owns the waiting queue and every policy's state. The engine calls a scheduler at four moments
(Appendix C.1's "three hooks" of Algorithm 4, plus finish):

1. `add(request, now)`       a request arrives; may reject it (a reason string, e.g. RPM);
2. `schedule(admit)`         pick waiting requests in policy order, calling `admit(request)`
                             for each; `admit` returns False when the request does not fit in
                             the KV budget, and the round stops there (head-of-line, as the
                             paper's Algorithm 2 and the artifact's `break`);
3. `on_tokens(request, num_prompt, num_output)`  tokens were processed for a running request:
                             the engine calls it with the prompt at admission, and
   `on_decode(requests)`     once per step with the batch, each of which got one output token
                             (by default `on_tokens(request, 0, 1)` for each);
4. `on_finish(request)`      a running request finished or was aborted.

A scheduler never sees tensors. Does not own: KV blocks (`kv_pool.py`) or running requests
(`engine.py`). Lessons 3-5 teach it.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable, Iterator

from minivtc.cost import PAPER_COST, Cost, LinearCost, ProfiledCost, fairness_bound
from minivtc.request import Request

Admit = Callable[[Request], bool]


class Scheduler:
    """The interface, with no-op hooks; each policy overrides what it needs."""

    name = "base"

    def add(self, request: Request, now: float) -> str | None:
        raise NotImplementedError

    def schedule(self, admit: Admit) -> None:
        raise NotImplementedError

    def remove(self, request: Request) -> None:
        """A waiting request was aborted: forget it."""
        raise NotImplementedError

    def waiting(self) -> Iterator[Request]:
        raise NotImplementedError

    def on_tokens(self, request: Request, num_prompt: int, num_output: int) -> None:
        pass

    def on_decode(self, requests: list[Request]) -> None:
        """One step gave each of `requests` one output token (one call per step, not per token:
        the simulator makes millions of tokens)."""
        for request in requests:
            self.on_tokens(request, 0, 1)

    def on_finish(self, request: Request) -> None:
        pass

    def check_invariants(self) -> None:
        pass

    def accounts(self) -> dict[str, tuple[float | None, float]]:
        """Per client the policy knows: (counter, weight); counter None for a policy without
        one. What the server's fairness view shows."""
        return {}

    def forget(self, idle: list[str], now: float) -> list[str]:
        """Of `idle` clients (nothing waiting or running), drop those whose state can no longer
        change a decision, and return them: a server meets unboundedly many clients."""
        return list(idle)  # no per-client state

    @property
    def num_waiting(self) -> int:
        return sum(1 for _ in self.waiting())


class FCFS(Scheduler):
    """First come, first served: arrival order; stop at the first request that does not fit."""

    name = "fcfs"

    def __init__(self) -> None:
        self.queue: deque[Request] = deque()

    def add(self, request: Request, now: float) -> str | None:
        self.queue.append(request)
        return None

    def schedule(self, admit: Admit) -> None:
        while self.queue and admit(self.queue[0]):
            self.queue.popleft()

    def remove(self, request: Request) -> None:
        self.queue.remove(request)

    def waiting(self) -> Iterator[Request]:
        return iter(self.queue)

    def on_decode(self, requests: list[Request]) -> None:
        pass  # arrival order needs no token counts

    @property
    def num_waiting(self) -> int:
        return len(self.queue)


class RPM(FCFS):
    """FCFS plus a rate limit: at most `limit` accepted requests per client in any 60 s window.

    The paper's RPM baseline rejects, it does not delay (Section 5.3, Figures 13-14): a
    request over the limit never enters the queue, and the engine turns the reason into an
    error (HTTP 429). Only accepted requests count toward the window.
    """

    window_s = 60.0

    def __init__(self, limit: int) -> None:
        super().__init__()
        if limit < 1:
            raise ValueError(f"rpm limit must be >= 1, got {limit}")
        self.limit = limit
        self.name = f"rpm:{limit}"
        self.accepted: dict[str, deque[float]] = {}  # client -> arrival times in the window

    def add(self, request: Request, now: float) -> str | None:
        times = self.accepted.setdefault(request.client_id, deque())
        while times and times[0] <= now - self.window_s:  # a request exactly 60 s old is out
            times.popleft()
        if len(times) >= self.limit:
            return (
                f"rate limit: client {request.client_id!r} already has {self.limit} requests "
                f"accepted in the last {self.window_s:.0f} s"
            )
        times.append(now)
        return super().add(request, now)

    def forget(self, idle: list[str], now: float) -> list[str]:
        """A client whose window holds no accepted request starts afresh either way."""
        window = now - self.window_s
        gone = [c for c in idle if not any(t > window for t in self.accepted.get(c, ()))]
        for c in gone:
            self.accepted.pop(c, None)
        return gone


# --- output-length predictors for VTC with prediction (Section 4.4, Algorithm 3) -------------


class MeanOfLast:
    """The paper's predictor: the mean output length of the client's last `window` requests."""

    def __init__(self, window: int = 5) -> None:
        self.window = window
        self.history: dict[str, deque[int]] = {}

    def predict(self, request: Request) -> float:
        past = self.history.get(request.client_id)
        return sum(past) / len(past) if past else 0.0  # 0 until one finishes: plain VTC

    def observe(self, request: Request) -> None:
        self.history.setdefault(request.client_id, deque(maxlen=self.window)).append(
            request.num_output
        )


class MovingAverage:
    """The official artifact's predictor (not the paper's mean of the last 5):
    P <- (4P + actual) / 5, starting from the first length."""

    def __init__(self) -> None:
        self.estimate: dict[str, float] = {}

    def predict(self, request: Request) -> float:
        return self.estimate.get(request.client_id, 0.0)

    def observe(self, request: Request) -> None:
        old = self.estimate.get(request.client_id)
        n = request.num_output
        self.estimate[request.client_id] = float(n) if old is None else (4 * old + n) / 5


class Oracle:
    """The true output length, known in simulation: max_tokens with EOS ignored (the artifact's
    oracle). With `spread` p > 0, a seeded uniform draw in [(1-p)L, (1+p)L]: "VTC (±50%)"."""

    def __init__(self, spread: float = 0.0, seed: int = 0) -> None:
        self.spread = spread
        self.rng = random.Random(seed)

    def predict(self, request: Request) -> float:
        true = request.params.max_tokens
        if not self.spread:
            return float(true)
        return self.rng.uniform(true * (1 - self.spread), true * (1 + self.spread))

    def observe(self, request: Request) -> None:
        pass


# --- VTC ---------------------------------------------------------------------------------------


class VTC(Scheduler):
    """The Virtual Token Counter, Algorithm 2 of the paper (Section 4.1).

    Every client has a counter: the service it has received, in cost units, divided by its
    weight. Dispatch picks the waiting client with the smallest counter, and that client's
    oldest request. Counters only grow, except the refund of an over-predicted output.

    Bound: with U = max(w_p * L_input, w_q * M) (L_input the longest prompt, M the pool's
    tokens), the waiting clients' counters stay within U of each other (Lemma 4.3), so two
    clients backlogged over any interval receive service within 2U of each other (Theorem 4.4),
    a backlogged client never gets 4U less than any other (Theorem 4.9), and a client that
    returns from idle waits at most 2(n-1)U / (slowest service rate) to be dispatched
    (Theorem 4.11). `lift=False` is LCF, the paper's broken baseline.

    Ties between equal counters go to the client seen first (as the artifact's dict order
    does). A server may forget an idle client (`forget`) without changing a decision; only its
    place in that order (`first_seen`, one int) is kept.

    Selecting the minimum is a heap with lazy deletion: O(log n) per decision, not the
    artifact's O(n) scan over clients. A heap entry (counter, first_seen, version, client) is
    live while the client waits and `version` is its latest. A live entry's counter may lag
    behind the client's: a charge only raises a counter, so the old key is a lower bound and
    the entry is re-keyed only if it reaches the top (lazy increase-key: one heap operation
    per dispatch instead of one per token charged). A refund lowers a counter, so it pushes.
    """

    def __init__(
        self,
        cost: Cost = PAPER_COST,
        weights: dict[str, float] | None = None,
        lift: bool = True,
        predictor: MeanOfLast | MovingAverage | Oracle | None = None,
        lift_last_left: bool = True,
        charge_first_token: bool = True,
        finish_charge: bool = False,
        name: str = "vtc",
    ) -> None:
        self.cost = cost
        self.weights = dict(weights or {})
        self.lift = lift
        self.predictor = predictor
        self.lift_last_left = lift_last_left  # False = the artifact: no lift to the last to leave
        self.charge_first_token = charge_first_token  # False = the artifact: 1st token free
        self.finish_charge = finish_charge  # True = the artifact: a charge per finish
        self.running: dict[str, Request] = {}  # admitted, not finished (for finish_charge)
        self.tokens_charged = 0  # output tokens charged so far: tells steps apart
        self.finish_charged_at = -1
        self.name = name
        self.counters: dict[str, float] = {}
        self.queues: dict[str, deque[Request]] = {}  # waiting requests per client
        self.first_seen: dict[str, int] = {}  # ties go to the client seen first (kept forever)
        self.num_entries = 0  # heap entries made so far: each is a client's latest version
        self.versions: dict[str, int] = {}
        self.heap: list[tuple[float, int, int, str]] = []
        self.last_left: str | None = None  # the last client whose queue emptied
        # request id -> (q, h(n_p, q)): the output tokens charged for so far (at dispatch, the
        # predicted length) and the service that came to; each new token charges the difference.
        self.charged: dict[str, tuple[float, float]] = {}
        self.bound: float | None = None  # U, set by the engine's check_fairness

    # -- the four hooks --

    def add(self, request: Request, now: float) -> str | None:
        client = request.client_id
        if client not in self.counters:  # new, or forgotten: a forgotten counter was <= floor
            self.counters[client] = 0.0
            self.first_seen.setdefault(client, len(self.first_seen))
            self.queues[client] = deque()
        if self.lift and not self.queues[client]:
            self.lift_counter(client)
        self.queues[client].append(request)
        if len(self.queues[client]) == 1:
            self.push(client)
        return None

    def schedule(self, admit: Admit) -> None:
        while (client := self.min_waiting_client()) is not None:
            request = self.queues[client][0]
            # Algorithm 2: stop the round at the first misfit; never skip to another client.
            # Skipping would let small requests of a high-counter client jump ahead, and the
            # bound's "one dispatch raises the minimum by at most w_p * L_input" would break.
            if not admit(request):  # admit() charges the prompt through on_tokens
                return
            self.queues[client].popleft()
            if not self.queues[client]:
                self.last_left = client

    def on_tokens(self, request: Request, num_prompt: int, num_output: int) -> None:
        if num_prompt:
            # Charged at dispatch, before the next pick (Footnote 5): otherwise the same
            # client would stay the minimum and take the whole admission round.
            predicted = self.predictor.predict(request) if self.predictor else 0.0
            service = self.cost(request.num_prompt, predicted)
            self.charged[request.request_id] = (predicted, service)
            self.running[request.request_id] = request
            self.charge(request.client_id, service)
        if num_output:
            self.charge_outputs([request], num_output)

    def on_decode(self, requests: list[Request]) -> None:
        self.charge_outputs(requests, 1)

    def charge_outputs(self, requests: list[Request], num_output: int) -> None:
        """Each of `requests` just got `num_output` tokens, n_q in all: charge its client
        h(n_p, n_q) - h(n_p, q), q being the output tokens already charged for (at first the
        length predicted at dispatch: nothing more is charged until n_q passes it).

        The loop body runs once per generated token, the hottest code of a simulation: one
        cost call per token (h(n_p, q) is remembered), the state read through locals."""
        self.tokens_charged += num_output * len(requests)
        charged, counters, weights = self.charged, self.counters, self.weights
        # The bound __call__: Python 3.11 runs a call to a bound method inline, but calls an
        # instance (LinearCost()) through C, at several times the cost.
        cost = self.cost.__call__
        for request in requests:
            n_q = len(request.output_ids)
            q, service = charged[request.request_id]  # made at dispatch (on_tokens)
            if n_q <= q:
                continue  # still within the prediction charged at dispatch
            now = cost(len(request.prompt_ids), n_q)
            charged[request.request_id] = (n_q, now)
            if n_q == 1 and not self.charge_first_token:
                continue  # the artifact leaves each first token uncharged (artifact_deviations.md)
            # charge(), inlined: h grows with n_q, so this raises the counter, and a raise
            # needs no heap push (the heap's keys are lower bounds).
            client = request.client_id
            counters[client] += (now - service) / weights.get(client, 1.0)

    def on_finish(self, request: Request) -> None:
        if self.finish_charge and self.tokens_charged != self.finish_charged_at:
            # The official artifact (lessons/artifact_deviations.md): when any request of a
            # step finishes, every request in the batch, the finishing ones included, is
            # charged one more w_q -- once per step (no token is charged between two finishes
            # of the same step).
            self.finish_charged_at = self.tokens_charged
            for r in self.running.values():
                self.charge(r.client_id, self.cost(r.num_prompt, 1) - self.cost(r.num_prompt, 0))
        self.running.pop(request.request_id, None)
        q, service = self.charged.pop(request.request_id, (0.0, 0.0))
        if q > request.num_output:  # refund the over-prediction (Algorithm 3)
            refund = service - self.cost(request.num_prompt, request.num_output)
            self.charge(request.client_id, -refund)
        if self.predictor is not None and request.finish_reason != "abort":
            self.predictor.observe(request)

    def remove(self, request: Request) -> None:
        queue = self.queues[request.client_id]
        queue.remove(request)
        if not queue:
            self.last_left = request.client_id

    def waiting(self) -> Iterator[Request]:
        return (r for q in self.queues.values() for r in q)

    def accounts(self) -> dict[str, tuple[float | None, float]]:
        return {c: (n, self.weights.get(c, 1.0)) for c, n in self.counters.items()}

    def forget(self, idle: list[str], now: float) -> list[str]:
        """Forget idle clients whose counter is at or below the lift floor F (the smallest
        waiting counter, or the last client to leave Q's): that changes no decision.

        Why: kept, such a client rejoins at max(counter, F') where F' >= F is the floor then
        (F never falls: charges raise counters, a joining client is lifted to F, a leaving
        one leaves a larger minimum); forgotten, it rejoins at max(0, F') = F' -- the same
        counter, and its place among ties (`first_seen`) is kept. This needs the lift to the last
        client that left (else an empty Q has no floor) and no refunds (Algorithm 3's refund
        lowers counters, so F could fall): with a predictor nothing is forgotten."""
        if not (self.lift and self.lift_last_left) or self.predictor is not None:
            return []
        floor = self.min_waiting_counter()
        if floor is None and self.last_left is not None:
            floor = self.counters[self.last_left]
        if floor is None:
            return []
        gone = [c for c in idle if c in self.counters and not self.queues[c]
                and c != self.last_left and self.counters[c] <= floor]  # fmt: skip
        for c in gone:
            del self.counters[c], self.queues[c]
            self.versions.pop(c, None)  # its heap entries are dead: versions.get gives None
        return gone

    def check_invariants(self) -> None:
        """Lemma 4.3, when the engine set `bound` (check_fairness=True): spread <= U."""
        waiting = [self.counters[c] for c, q in self.queues.items() if q]
        live = {c: k for k, _, v, c in self.heap if self.is_live(v, c)}
        assert live.keys() == {c for c, q in self.queues.items() if q}, "heap lost a client"
        assert all(k <= self.counters[c] for c, k in live.items()), "a key is above its counter"
        if self.bound is not None and waiting:
            spread = max(waiting) - min(waiting)
            assert spread <= self.bound + 1e-6, (
                f"Lemma 4.3 violated: waiting counters spread {spread:.1f} > U = {self.bound:.1f}"
            )

    # -- helpers --

    def lift_counter(self, client: str) -> None:
        """A client (re)joining the queue is lifted so it cannot bank idle time (Lemma 4.3).

        Without the lift (LCF) a client back from idle holds a stale low counter and takes
        every dispatch until it catches up: the 2U bound fails for the others.
        """
        floor = self.min_waiting_counter()
        if floor is None and self.lift_last_left and self.last_left is not None:
            floor = self.counters[self.last_left]  # Q empty: the last client that left Q
        if floor is not None and floor > self.counters[client]:
            self.counters[client] = floor

    def charge(self, client: str, amount: float) -> None:
        self.counters[client] += amount / self.weights.get(client, 1.0)
        if amount < 0 and self.queues[client]:
            self.push(client)  # the live entry's key is now too high to be a lower bound

    def push(self, client: str) -> None:
        heapq.heappush(self.heap, self.entry(client))
        if len(self.heap) > 64 and len(self.heap) > 4 * len(self.queues):
            self.compact()

    def entry(self, client: str) -> tuple[float, int, int, str]:
        """A new heap entry for `client`: its counter now, and a new version (older entries
        of the client are dead)."""
        self.num_entries += 1  # never reused, even for a client forgotten and seen again
        self.versions[client] = self.num_entries
        return (self.counters[client], self.first_seen[client], self.versions[client], client)

    def min_waiting_client(self) -> str | None:
        while self.heap:
            counter, _, version, client = self.heap[0]
            if not self.is_live(version, client):
                heapq.heappop(self.heap)  # dead: superseded by a newer entry, or left Q
            elif counter != self.counters[client]:  # charged since: re-key, look again
                heapq.heapreplace(self.heap, self.entry(client))
            else:
                return client  # every other key is a lower bound of its counter
        return None

    def min_waiting_counter(self) -> float | None:
        client = self.min_waiting_client()
        return None if client is None else self.counters[client]

    def is_live(self, version: int, client: str) -> bool:
        """A heap entry is live if it is its client's latest and the client waits."""
        return version == self.versions.get(client) and bool(self.queues[client])

    def compact(self) -> None:
        self.heap = [e for e in self.heap if self.is_live(e[2], e[3])]
        heapq.heapify(self.heap)

    def set_bound(self, max_input: int, pool_tokens: int) -> None:
        """U in counter units (divided by the smallest weight below 1)."""
        w_p, w_q = getattr(self.cost, "w_p", 1.0), getattr(self.cost, "w_q", 2.0)
        min_weight = min(self.weights.values(), default=1.0)
        self.bound = fairness_bound(max_input, pool_tokens, w_p, w_q) / min(min_weight, 1.0)


SCHEDULERS = (
    "fcfs, rpm:N, lcf, vtc, vtc-artifact, vtc-predict, vtc-predict-ema, vtc-oracle, "
    "vtc-oracle:P, and any of the VTC family with -profile (e.g. vtc-profile)"
)


def make_scheduler(
    name: str, weights: dict[str, float] | None = None, seed: int = 0, artifact: bool = False
) -> Scheduler:
    """A scheduler from its command-line name. `weights` (operator-set) apply to the VTC family;
    `artifact=True` reproduces the official artifact's counter quirks (no lift to the last
    client to leave, an uncharged first token, an extra charge on finish events; see
    lessons/artifact_deviations.md).
    A VTC-family name ending in "-profile" charges the profiled h instead of w_p n_p + w_q n_q."""
    if name == "fcfs":
        return FCFS()
    if name.startswith("rpm:"):
        return RPM(int(name.split(":", 1)[1]))
    base, profiled = (
        (name[: -len("-profile")], True) if name.endswith("-profile") else (name, False)
    )
    options = {
        "weights": weights, "name": name, "cost": ProfiledCost() if profiled else LinearCost(),
        "lift_last_left": not artifact, "charge_first_token": not artifact,
        "finish_charge": artifact,
    }  # fmt: skip
    if base == "lcf":
        return VTC(lift=False, **options)
    if base == "vtc":
        return VTC(**options)
    if base == "vtc-artifact":  # VTC as the official artifact charges (artifact_deviations.md)
        quirks = {"lift_last_left": False, "charge_first_token": False, "finish_charge": True}
        return VTC(**{**options, **quirks})
    if base == "vtc-predict":
        return VTC(predictor=MeanOfLast(), **options)
    if base == "vtc-predict-ema":
        return VTC(predictor=MovingAverage(), **options)
    if base == "vtc-oracle" or base.startswith("vtc-oracle:"):
        spread = float(base.split(":", 1)[1]) if ":" in base else 0.0
        return VTC(predictor=Oracle(spread, seed), **options)
    raise ValueError(f"unknown scheduler {name!r}; choose one of: {SCHEDULERS}")
