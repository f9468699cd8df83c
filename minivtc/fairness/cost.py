"""What serving a client costs, in the paper's units: the cost function h and the bound U.

Owns every price of service, written here once: the paper's weights (w_p = 1 per prompt
token, w_q = 2 per output token, Section 3.1); `LinearCost` (h(n_p, n_q) = w_p n_p + w_q n_q);
`ProfiledCost` (the artifact's h fitted to A10G step times, Section 4.2 and Appendix B.2); a
cached prompt token's price w_c (`cache_discount`); the linear price the metrics and
`BacklogWatch` measure service by (`linear_price`); and the bounds: Lemma 4.3's U for the
linear h (`fairness_bound`, with its proof and the course's correction for w_p > w_q), the
bound each h states (`spread_bound`; the profiled h's from its largest charge for one token)
and fair preemption's U_P (`preemptive_bound`). A leaf module: it imports
nothing of the package, so the scheduler, the fairness check, the metrics, the server's
reports and the report generator all price service the same way.

Not to be confused with the simulator's step-time models (`sim/step_time.py`): those say how long
a step takes on a GPU; this says how much service a client received.

A request with n_p prompt tokens that has generated n_q tokens has received h(n_p, n_q). VTC
charges it in pieces as it grows: h(n_p, 0) when it is dispatched (the prompt), then
h(n_p, n_q) - h(n_p, n_q - 1) for its n_q-th output token (Section 4.2); with the linear h
that is w_p n_p, then w_q per token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Cost", "LinearCost", "PAPER_COST", "ProfiledCost", "W_P", "W_Q", "cache_discount"]
__all__ += ["check_cached_weight", "fairness_bound", "linear_price", "preemptive_bound"]
__all__ += ["spread_bound", "weights_of"]

W_P, W_Q = 1.0, 2.0  # the paper's weights: an output token costs twice a prompt token


@dataclass(frozen=True)
class LinearCost:
    """h(n_p, n_q) = w_p * n_p + w_q * n_q: the paper's main cost."""

    w_p: float = W_P
    w_q: float = W_Q

    def __call__(self, n_p: float, n_q: float) -> float:
        return self.w_p * n_p + self.w_q * n_q

    def spread_bound(self, max_input: int, pool_tokens: int) -> float:
        """Lemma 4.3's U for this h (`fairness_bound`)."""
        return fairness_bound(max_input, pool_tokens, self.w_p, self.w_q)


@dataclass(frozen=True)
class ProfiledCost:
    """The artifact's h fitted to A10G step times, in ms per request (Appendix B.2).

    `w_p`, `w_q`: h's linear terms, the price of a prompt token (exact: h(n_p, 0) is linear)
    and of a first output token. What the cached discount and the default preemption gap read
    (`weights_of`); not what bounds the spread: an output token's charge grows with the
    request, h(n_p, n_q) - h(n_p, n_q - 1) = 0.10 + 0.004 n_p + 0.0032 (2 n_q - 1), far
    above w_q. The bound this h states is `spread_bound`'s."""

    w_p: float = 0.21001891
    w_q: float = 0.10075395

    def __call__(self, n_p: float, n_q: float) -> float:
        return (
            0.21001891 * n_p
            + 0.10075395 * n_q
            + 0.0039868 * n_p * n_q
            + 0.00324733 * n_q**2
            + 1.14601454
        )

    def spread_bound(self, max_input: int, pool_tokens: int) -> float:
        """U for this h (ours; the paper restates no bound for a general h, Section 4.2):
        max over a dispatched prompt of n <= min(L_input, M) tokens of h(n, 0) + mu (M - n),
        mu the largest charge of one output token that fits in memory.

        `fairness_bound`'s proof with two prices changed: the dispatch at the smallest counter
        costs h(n, 0), and each of the at most M - n tokens generated after it costs at most
        mu. The charge of the n_q-th token, 0.10 + 0.004 n_p + 0.0032 (2 n_q - 1), grows
        faster with n_q than with n_p (0.0065 > 0.004 per token), so over n_p + n_q <= M it is
        largest at n_p = 0, n_q = M. h(n, 0) + mu (M - n) is linear in n: largest at an end.
        Loose by about 2 (the tokens of a request do not all cost mu) and quadratic in M:
        6,590 ms at M = 1000, 650,000 at the paper's M = 10000."""
        m = pool_tokens
        n = min(max_input, m)
        mu = self(0, m) - self(0, m - 1)  # the largest charge of one token in memory
        return max(self(max_input, 0), self(n, 0) + mu * (m - n), self(0, 0) + mu * m)


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
    """U = max(w_p L_input, w_q M + (w_p - w_q)+ min(L_input, M)): Lemma 4.3's counter
    spread for the linear h with full reservation; 2U bounds Theorem 4.4's gap.

    L_input is the longest prompt that can be admitted, M the most tokens the pool holds.
    With w_p <= w_q (the paper's 1 and 2) it is the paper's U = max(w_p L_input, w_q M). With
    w_p > w_q the paper's U fails and the second term is ours, the course's, not the paper's:
    a client dispatched at the smallest counter, charged w_p n_p, whose running requests then
    generate the M - n_p tokens left, rises w_p n_p + w_q (M - n_p) > w_q M.

    The proof (ours; the paper's intuition made exact). Assumed: full reservation (a request
    holds prompt + max_tokens from its dispatch, so the running requests' reservations fit
    M; `admission.FullReservation`), no refunds (no predictor) and the lift. The smallest
    waiting counter F never falls: charges only raise counters, a client joining Q is lifted
    to F or above, one leaving Q leaves a minimum at least as large, and with Q empty the
    floor is the last to leave, whose counter was >= F. Take a waiting client i and the last
    instant c_i was set from the floor (a dispatch at the smallest counter, or a lift that
    raised it): c_i was then F at that instant, <= F now. Since then it was charged w_p n for
    the prompt dispatched then (n <= min(L_input, M); n = 0 at a lift), and w_q for each token
    its running requests generated; those requests were all dispatched by then and reserve,
    with the new prompt, at most M, so they generate at most M - n tokens. So
    c_i - F <= w_p n + w_q (M - n), largest at n = 0 if w_p <= w_q, at n = min(L_input, M)
    otherwise. A client never set from the floor never ran and sits at 0, <= F. (w_p L_input
    counts only for an L_input above M, which full reservation never admits; it keeps the
    paper's form.) Weights divide both terms by the client's. Without full reservation it can
    fail: the artifact's peak check admits requests whose full lengths add up past M (Problem
    set 1), and blocks on demand have `preemptive_bound`."""
    surplus = max(w_p - w_q, 0.0) * min(max_input, pool_tokens)
    return max(w_p * max_input, w_q * pool_tokens + surplus)


def spread_bound(cost: Cost, max_input: int, pool_tokens: int) -> float | None:
    """Lemma 4.3's U for the cost h, as h states it (`LinearCost.spread_bound`,
    `ProfiledCost.spread_bound`); None for an h that states none (the check refuses it)."""
    bound = getattr(cost, "spread_bound", None)
    return None if bound is None else float(bound(max_input, pool_tokens))


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
