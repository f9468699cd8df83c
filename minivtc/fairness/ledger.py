"""A policy's books: what reports, checks, the fair victim, the server and the gateway read and
correct, apart from the loop the engine calls.

The engine's loop calls a policy's seven methods (`scheduler.py`: add, peek, dispatch,
on_decode, on_finish, requeue, remove). Everything else other layers want of a policy goes
through its `ledger`, one object per policy (`policy.ledger`):

- reads: `counter`, `waiting_counters` (Lemma 4.3's spread, `fairness_check.py`), `accounts`
  (the server's fairness view), `counters` (its counters alone: the fair victim, a run's
  result, a shared store), `client_weights` (Section 4.3's shares),
  `refunds` (Algorithm 3 may lower a counter), `dispatch_charge`, `gap_bound` (the bound the
  policy states), `keeps_counters` (the VTC family);
- corrections: `settle` and `unadmit` (the gateway learns a request's true size, or that it
  never ran: `fleet/dispatcher.py`), `adopt` (counters kept fleet-wide by several gateways),
  `forget` (a server meets unboundedly many clients), `set_preempt_gap` (fair preemption).

`Ledger` is the books of a policy without counters (FCFS; RPM and DRR add what they keep);
VTC's are `vtc.VTCLedger`. A ledger never changes the queue Q: the loop's interface does
(`unadmit` refunds, the caller requeues). Plain Python: no tensors.
"""

from __future__ import annotations

import math

from minivtc.requests.request import Request

__all__ = ["Ledger", "NO_BOOKS"]


class Ledger:
    """The books of a policy that keeps no counter: nothing to read, nothing to correct."""

    keeps_counters = False  # the VTC family: a virtual counter per client (Lemma 4.3's spread)

    def counter(self, client: str) -> float | None:
        """`client`'s virtual counter (None: the policy keeps none, or never saw it)."""
        return None

    def waiting_counters(self) -> list[float]:
        """The counters of the clients with a request in Q (Lemma 4.3 bounds their spread)."""
        return []

    def accounts(self) -> dict[str, tuple[float | None, float]]:
        """Per client the policy knows: (counter, weight); counter None for a policy without
        one. What the server's fairness view shows."""
        return {}

    def counters(self) -> dict[str, float]:
        """Per client with a counter: the counter (`accounts` without the weights and without
        the clients a policy keeps no counter for)."""
        return {c: n for c, (n, _) in self.accounts().items() if n is not None}

    def client_weights(self) -> dict[str, float]:
        """The operator-set shares (Section 4.3), by client; {}: every client weighs 1."""
        return {}

    def refunds(self) -> bool:
        """Whether a counter may fall (Algorithm 3 refunds an over-prediction): no bound on
        the spread is then stated."""
        return False

    def dispatch_charge(self, request: Request) -> float:
        """What `dispatch` charged for `request`, in counter units (0: nothing)."""
        return 0.0

    def gap_bound(self, u: float) -> float | None:
        """The service gap the policy promises two backlogged clients, given Lemma 4.3's U
        for this run (`cost.fairness_bound`): the engine's check_fairness reports it. None:
        the policy states no bound (FCFS, RPM)."""
        return None

    def settle(self, request: Request, num_prompt: int, num_output: int) -> None:
        """A dispatched request's true size is known (a backend's final usage): correct what
        was charged for it. A policy without counters has nothing to correct."""

    def unadmit(self, request: Request) -> None:
        """A dispatched request never ran (its backend gave it back): refund its dispatch, as
        if never dispatched. The caller then `requeue`s it (the loop's interface)."""

    def adopt(self, counters: dict[str, float]) -> None:
        """Set the given clients' counters to these values, kept for a whole fleet (several
        gateways sharing one set of counters). A policy without counters has none to set."""

    def forget(self, idle: list[str], now: float) -> list[str]:
        """Of `idle` clients (nothing waiting or running), drop those whose state can no longer
        change a decision, and return them: a server meets unboundedly many clients."""
        return list(idle)  # no per-client state

    def set_preempt_gap(self, gap: float | None, pool_tokens: int) -> float:
        """The engine will preempt running clients more than `gap` ahead of a waiting one
        (blocks on demand, the fair victim); return the gap in effect (None: the policy's
        default). A policy with counters adapts its lift (`vtc.py`); one without has no
        client ahead of another, so nothing is displaced."""
        return math.inf


NO_BOOKS = Ledger()  # stateless: FCFS's, and any policy's that sets no ledger of its own
