"""What serving a client costs, in the paper's units: the cost function h and the bound U.

Owns every price of service, written here once: the paper's weights (w_p = 1 per prompt
token, w_q = 2 per output token, Section 3.1); `LinearCost` (h(n_p, n_q) = w_p n_p + w_q n_q);
`ProfiledCost` (the artifact's h fitted to A10G step times, Section 4.2 and Appendix B.2); a
cached prompt token's price w_c (`cache_discount`); the linear price the metrics and
`BacklogWatch` measure service by (`linear_price`); and the bounds, Lemma 4.3's U
(`fairness_bound`) and fair preemption's U_P (`preemptive_bound`). A leaf module: it imports
nothing of the package, so the scheduler, the fairness check, the metrics, the server's
reports and the report generator all price service the same way.

Not to be confused with the simulator's step-time models (`sim.py`): those say how long a step
takes on a GPU; this says how much service a client received.

A request with n_p prompt tokens that has generated n_q tokens has received h(n_p, n_q). VTC
charges it in pieces as it grows: h(n_p, 0) when it is dispatched (the prompt), then
h(n_p, n_q) - h(n_p, n_q - 1) for its n_q-th output token (Section 4.2); with the linear h
that is w_p n_p, then w_q per token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

W_P, W_Q = 1.0, 2.0  # the paper's weights: an output token costs twice a prompt token


@dataclass(frozen=True)
class LinearCost:
    """h(n_p, n_q) = w_p * n_p + w_q * n_q: the paper's main cost."""

    w_p: float = W_P
    w_q: float = W_Q

    def __call__(self, n_p: float, n_q: float) -> float:
        return self.w_p * n_p + self.w_q * n_q


@dataclass(frozen=True)
class ProfiledCost:
    """The artifact's h fitted to A10G step times, in ms per request (Appendix B.2)."""

    w_p: float = 0.21001891  # the linear input term, so U stays meaningful
    w_q: float = 0.10075395

    def __call__(self, n_p: float, n_q: float) -> float:
        return (
            0.21001891 * n_p
            + 0.10075395 * n_q
            + 0.0039868 * n_p * n_q
            + 0.00324733 * n_q**2
            + 1.14601454
        )


Cost = Callable[[float, float], float]
PAPER_COST = LinearCost()  # h with the paper's weights: the default everywhere


def weights_of(cost: Cost) -> tuple[float, float]:
    """(w_p, w_q): the linear terms of h (the paper's, for a cost that names none)."""
    return getattr(cost, "w_p", W_P), getattr(cost, "w_q", W_Q)


def cache_discount(cost: Cost, cached_weight: float | None, num_cached: int) -> float:
    """What `num_cached` prompt tokens found in the prefix cache take off a dispatch charge:
    (w_p - w_c) each (w_c None: w_p, no discount). Lemma 4.3's U is unchanged: a dispatch
    still costs at most w_p L_input. The miss that fills the cache is paid at w_p by the
    request that computes it."""
    if cached_weight is None:
        return 0.0
    return (weights_of(cost)[0] - cached_weight) * num_cached


def check_cached_weight(cost: Cost, cached_weight: float | None) -> None:
    """w_c is a price between nothing and a prompt token's: 0 <= w_c <= w_p."""
    w_p = weights_of(cost)[0]
    if cached_weight is not None and not 0 <= cached_weight <= w_p:
        raise ValueError(f"cached_weight must be in [0, w_p = {w_p}], got {cached_weight}")


def linear_price(
    num_input: int,
    num_output: int,
    num_cached: int = 0,
    cost: Cost = PAPER_COST,
    cached_weight: float | None = None,
) -> float:
    """Service as the linear h prices it: w_p per prompt token, w_q per output token, and a
    cached prompt token at w_c (`cache_discount`). What the metrics and `BacklogWatch`
    measure clients by, independently of any scheduler's counters."""
    w_p, w_q = weights_of(cost)
    return w_p * num_input + w_q * num_output - cache_discount(cost, cached_weight, num_cached)


def fairness_bound(max_input: int, pool_tokens: int, w_p: float = W_P, w_q: float = W_Q) -> float:
    """U = max(w_p * L_input, w_q * M): Lemma 4.3's counter spread; 2U bounds Theorem 4.4's gap.

    L_input is the longest prompt that can be admitted, M the most tokens the pool holds."""
    return max(w_p * max_input, w_q * pool_tokens)


def preemptive_bound(
    max_input: int, max_running: int, gap: float, w_p: float = W_P, w_q: float = W_Q
) -> float:
    """U_P = max(gap, w_p * L_input) + w_q * B: the waiting counters' spread with blocks on
    demand and fair preemption at `gap` (the paper's Appendix C.3 asks for it; `vtc.py`);
    2 U_P bounds the service gap of two backlogged clients, as 2U does in Theorem 4.4.

    B is the most requests one client can run at once. The M of U is gone: a client running
    ahead is preempted once it leads a waiting client by `gap`, so the memory it holds no
    longer measures how far ahead it can get. B replaces it: at most the engine's max_running
    and the pool's blocks, in practice far below M (a request holds many tokens), but a
    pool of one-token requests could make w_q B as large as w_q M; `FairnessCheck.gap_bound` reports
    the bound with the run's own largest one-step charge.

    The proof, as Lemma 4.3's: a waiting client's counter last rose at its dispatch (by at
    most w_p L_input over the smallest, which never falls), or in a step it ran. After each
    admission round every running client is within max(gap, w_p L_input) of the smallest
    waiting counter: the round stops at a head that does not fit only once no running client
    is more than `gap` ahead of it. One step adds at most w_q per running request. And a
    client joining an empty Q is lifted to within `gap` of every client charged since Q
    emptied, so no client that ran ahead of Q can enter it further ahead."""
    return max(gap, w_p * max_input) + w_q * max_running
