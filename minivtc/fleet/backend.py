"""A backend's room, as the dispatcher sees it: a token budget and what is reserved on it.

Owns `Backend`: the capacity model of one replica. Its budget is the KV tokens it serves (for
a minivtc backend its `--kv-tokens`); each request bound to it reserves `prompt + max_tokens`
(the paper's full reservation, Section 3.1) until it finishes, so a request bound only where
it fits is admitted by the backend at once: backends never queue, and the dispatcher's order
is the only order. Also where the request is (`requests`) and whether the backend may take
work (`healthy`). Does not own the choice of backend (`routing.py`) or of request
(`dispatcher.py`). Plain Python. minivtc/fleet/README.md; Lesson 14.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minivtc.requests.request import Request

__all__ = ["Backend"]


@dataclass(eq=False)  # a backend is itself, not its numbers: two empty ones are not equal
class Backend:
    """`name`: how logs and metrics call it (a URL, "replica-3"); `budget`: its KV tokens."""

    name: str
    budget: int
    reserved: int = 0  # tokens reserved by the requests bound to it
    healthy: bool = True  # False: skipped until a health check says otherwise
    requests: dict[str, int] = field(default_factory=dict)  # request id -> tokens reserved
    served: int = 0  # requests it finished (a fleet's per-replica table)
    elsewhere: int = 0  # tokens other gateways booked on it (a shared store's view: `fleet_member`)

    def __post_init__(self) -> None:
        if self.budget < 2:
            raise ValueError(
                f"backend {self.name!r}: budget must be >= 2 tokens, got {self.budget}"
            )

    def fits(self, request: Request) -> bool:
        """Full reservation: `request` may run here to its max_tokens without running out."""
        return self.reserved + self.elsewhere + request.max_num_tokens <= self.budget

    def reserve(self, request: Request) -> None:
        assert request.request_id not in self.requests, f"{request.request_id} bound twice"
        self.requests[request.request_id] = request.max_num_tokens
        self.reserved += request.max_num_tokens

    def release(self, request_id: str) -> None:
        """`request_id` finished, failed or was given back: its reservation is free again."""
        self.reserved -= self.requests.pop(request_id)

    @property
    def load(self) -> float:
        """The share of the budget reserved: least-loaded routing compares it."""
        return (self.reserved + self.elsewhere) / self.budget

    def check_invariants(self) -> None:
        assert self.reserved == sum(self.requests.values()), (
            f"backend {self.name!r}: reserved {self.reserved} != its requests' "
            f"{sum(self.requests.values())}"
        )
        assert 0 <= self.reserved, f"backend {self.name!r}: reserved {self.reserved} < 0"
