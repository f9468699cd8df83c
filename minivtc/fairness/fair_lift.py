"""Fair preemption's lift: the strategy the fair victim needs VTC's lift to follow (Lesson 11).

Owns `FairLift`. Not Algorithm 2's, so not `VTC`'s: the ledger installs it
(`VTCLedger.set_preempt_gap`) when the engine preempts by counter (`preemption.Fair`), and VTC
consults it when a client joins an empty Q and tells it who ran meanwhile. The paper's
Appendix C.3 asks for such an extension. Plain Python: no tensors.
"""

from __future__ import annotations

from minivtc.requests.request import Request

__all__ = ["FairLift"]


class FairLift:
    """Fair preemption's lift (the module docstring says who installs and consults it).

    The engine displaces clients more than `gap` ahead of a waiting one, and a client joining
    an empty Q is lifted to within `gap` of every client that ran (was charged) since Q
    emptied. Those clients were served while nobody waited, and the last to leave Q may lie
    far below them: a client lifted only that far would displace them at once and then take
    every dispatch until it caught up with all they received meanwhile, a lead that only the
    memory they held (M) would limit. The preemptive bound needs it limited by `gap`: the
    waiting counters then stay within U_P = max(gap, w_p L_input) + w_q B
    (`cost.preemptive_bound`, its proof and what B is).
    """

    def __init__(self, gap: float) -> None:
        self.gap = gap
        self.ran_since: set[str] = set()  # clients charged since Q emptied

    def ran(self, requests: list[Request]) -> None:
        """A step charged `requests` while Q was empty."""
        self.ran_since.update(r.client_id for r in requests)

    def floor(self, counters: dict[str, float], floor: float | None) -> float | None:
        """`floor` (Algorithm 2's, Q empty), raised to within `gap` of those that ran."""
        if not self.ran_since:
            return floor
        top = max(counters[c] for c in self.ran_since) - self.gap
        return top if floor is None else max(floor, top)

    def reset(self) -> None:
        """A client joined Q: Q is empty no longer, and who ran while it was counts no more."""
        self.ran_since.clear()

    def forget(self, client: str) -> None:
        """`client`'s counter was dropped (`VTCLedger.forget`: it was at most the floor, so it
        lifts no one): `floor` reads it no more."""
        self.ran_since.discard(client)
