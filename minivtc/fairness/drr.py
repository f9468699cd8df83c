"""Deficit Round Robin adapted to LLM serving: the classical fair queue VTC descends from.

Owns `DRR`, the paper's Appendix C.2 (`make_scheduler("drr:Q")`). Classical DRR (Shreedhar and
Varghese, 1995) visits the backlogged flows in turn; a flow whose turn begins gets a quantum Q
of credit (its deficit) and sends packets while its deficit covers them. A request's cost is
not known when it is sent, so here a dispatch pays the prompt, each generated token pays its
charge as it comes, and a deficit may go negative (a debt, paid by waiting turns). A client
that rejoins has no credit, as VTC's lift keeps a returning client from banking service. The
method docstrings say the rest.

Its bound: two clients backlogged over an interval receive service within 2(U + Q) of each other
(`gap_bound`; U is Lemma 4.3's, as for VTC: `cost.fairness_bound`). Over whole rounds both
receive Q per round; within a round a client can be ahead by its quantum, one dispatch's
overshoot (at most w_p L_input) and the decode charges its running requests build up while the
other waits for memory (at most w_q M). As Q shrinks below one token's cost, DRR tends to VTC
(Appendix C.2). In the coursework it is one answer to the capstone (`course/capstone.py`: a fair
policy of the student's own), kept in the instructor's edition only. Plain Python: no tensors.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from minivtc.fairness.cost import PAPER_COST, Cost
from minivtc.fairness.ledger import Ledger
from minivtc.fairness.scheduler import Scheduler
from minivtc.requests.request import Request

__all__ = ["DRR"]


class DRR(Scheduler):
    """Deficit Round Robin with a `quantum` of credit per turn (the module docstring)."""

    def __init__(self, quantum: float = 256.0, cost: Cost = PAPER_COST) -> None:
        if not quantum > 0:
            raise ValueError(f"the DRR quantum must be > 0, got {quantum}")
        self.quantum, self.cost = quantum, cost
        self.name = f"drr:{quantum:g}"
        self.queues: dict[str, deque[Request]] = {}  # waiting requests per client
        self.active: deque[str] = deque()  # backlogged clients, the one whose turn it is first
        self.deficits: dict[str, float] = {}
        self.turn_begun = False  # has active[0] received this turn's quantum?
        self.charged: dict[str, tuple[int, float]] = {}  # request id -> (n_q, h(n_p, n_q))
        self.ledger = DRRLedger(self)

    def add(self, request: Request, now: float) -> str | None:
        """Queue `request`; a client with nothing waiting joins the round, at its back, with
        no credit (`join_if_idle`)."""
        self.join_if_idle(request.client_id).append(request)
        return None

    def peek(self) -> Request | None:
        """The next request of the client whose turn it is: a turn begins with the quantum
        and lasts while the deficit is positive, then passes to the next client."""
        while self.active:
            client = self.active[0]
            if not self.turn_begun:
                self.deficits[client] += self.quantum
                self.turn_begun = True
            if self.deficits[client] > 0:
                return self.queues[client][0]
            self.pass_turn()  # spent: the next client's turn
        return None

    def dispatch(self, request: Request) -> None:
        """The prompt costs h(n_p, 0) (nothing more for a request back from a preemption); a
        client whose queue empties leaves the round."""
        client = request.client_id
        assert self.queues[client][0] is request, "dispatch takes the request peek offered"
        if not request.num_preemptions:
            service = self.cost(request.num_prompt, 0)
            self.charged[request.request_id] = (0, service)
            self.deficits[client] -= service
        self.queues[client].popleft()
        if not self.queues[client]:  # it leaves the round
            self.active.popleft()
            self.turn_begun = False

    def on_decode(self, requests: list[Request]) -> None:
        """Each of `requests` got a token: its client's deficit pays h(n_p, n_q) - h(n_p,
        n_q - 1)."""
        for r in requests:
            _, before = self.charged[r.request_id]
            now = self.cost(len(r.prompt_ids), len(r.output_ids))
            self.charged[r.request_id] = (len(r.output_ids), now)
            self.deficits[r.client_id] -= now - before

    def on_finish(self, request: Request) -> None:
        self.charged.pop(request.request_id, None)

    def remove(self, request: Request) -> None:
        queue = self.queues[request.client_id]
        queue.remove(request)
        if not queue:
            self.leave(request.client_id)

    def requeue(self, request: Request) -> None:
        self.join_if_idle(request.client_id).appendleft(request)

    def waiting(self) -> Iterator[Request]:
        return (r for q in self.queues.values() for r in q)

    def gap_bound(self, u: float) -> float | None:
        """The service-gap bound 2(U + Q) (see the module docstring); its ledger reports it."""
        return 2 * (u + self.quantum)

    def check_invariants(self) -> None:
        backlogged = [c for c, q in self.queues.items() if q]
        assert sorted(backlogged) == sorted(self.active), "the round lost a backlogged client"
        assert len(set(self.active)) == len(self.active), "a client is in the round twice"

    def join_if_idle(self, client: str) -> deque[Request]:
        """`client`'s queue; a client with nothing waiting first joins the round, at its back,
        with no credit: a positive deficit drops to 0, a debt stays."""
        queue = self.queues.setdefault(client, deque())
        if not queue:
            self.deficits[client] = min(self.deficits.get(client, 0.0), 0.0)
            self.active.append(client)
        return queue

    def pass_turn(self) -> None:
        self.active.rotate(-1)
        self.turn_begun = False

    def leave(self, client: str) -> None:
        if self.active and self.active[0] == client:
            self.turn_begun = False
        self.active.remove(client)


class DRRLedger(Ledger):
    """DRR's books: its clients (deficits are credit, not counters) and the bound it states."""

    def __init__(self, drr: DRR) -> None:
        self.drr = drr

    def accounts(self) -> dict[str, tuple[float | None, float]]:
        return {c: (None, 1.0) for c in self.drr.deficits}

    def gap_bound(self, u: float) -> float | None:
        return self.drr.gap_bound(u)  # the policy's own statement (a capstone states its own)

    def forget(self, idle: list[str], now: float) -> list[str]:
        drr = self.drr
        gone = [c for c in idle if not drr.queues.get(c)]
        for c in gone:  # idle past the forget horizon: its debt, if any, is forgiven
            drr.queues.pop(c, None)
            drr.deficits.pop(c, None)
        return gone
