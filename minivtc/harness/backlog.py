"""Theorem 4.4's quantity, measured on a run: the largest service gap between two clients over
an interval in which both were backlogged.

Owns `BacklogWatch`, which steps an engine and keeps, for every pair of clients backlogged
together, the running difference of their service since the pair's interval began; the worst
|W_f(t1, t2) - W_g(t1, t2)| over all such intervals is what Theorem 4.4 bounds by 2U (and
fair preemption by 2 U_P, `cost.preemptive_bound`). Service is measured from the tokens the
engine processed (w_p per prompt token, w_c per prompt token found in the prefix cache, w_q
per output token, divided by the client's weight), independently of any scheduler's counters.

Backlogged is Definition 4.1's: a request in the waiting queue at every instant of the step.
A client waiting before and after a step may still have left the queue inside it: its only
waiting request admitted, then preempted back. `BacklogWatch` sees that through the engine's
`preempt` and does not count the client as backlogged in that step. Used by `simulate(...,
watch_backlog=True)`, the fair-memory experiment and the course's graded harness. Plain Python.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from minivtc.fairness.cost import W_P, W_Q, LinearCost, linear_price
from minivtc.vocab.request import Request


class BacklogWatch:
    """Wraps `engine`: call `step()` instead of `engine.step()`; read `worst` and `pair`."""

    def __init__(
        self, engine, w_p: float = W_P, w_q: float = W_Q, w_c: float | None = None
    ) -> None:
        self.engine, self.cost, self.w_c = engine, LinearCost(w_p, w_q), w_c
        self.rejoined = watch_rejoining(engine)
        self.running_diff: dict[tuple[str, str], tuple[float, float, float]] = {}
        self.worst = 0.0  # the largest gap so far
        self.pair: tuple[str, str] | None = None  # and between whom

    def step(self) -> list[Request]:
        before = self.waiting()
        tokens = self.tokens(before)
        self.rejoined.clear()
        ran = self.engine.step()
        backlogged = sorted(before & self.waiting() - self.rejoined)
        after = self.tokens(backlogged)
        weights = self.engine.scheduler.accounts()
        service = {
            c: self.price(*(a - b for a, b in zip(after[c], tokens[c], strict=True)))
            / weights.get(c, (None, 1.0))[1]
            for c in backlogged
        }
        self.update(backlogged, service)
        return ran

    def update(self, backlogged: list[str], service: dict[str, float]) -> None:
        """Extend each pair's interval by this step; a pair not both backlogged starts over."""
        diffs = {}
        for f, g in itertools.combinations(backlogged, 2):
            prefix, lo, hi = self.running_diff.get((f, g), (0.0, 0.0, 0.0))
            prefix += service[f] - service[g]
            lo, hi = min(lo, prefix), max(hi, prefix)
            diffs[f, g] = (prefix, lo, hi)
            if hi - lo > self.worst:
                self.worst, self.pair = hi - lo, (f, g)
        self.running_diff = diffs

    def price(self, num_input: int, num_output: int, num_cached: int) -> float:
        return linear_price(num_input, num_output, num_cached, self.cost, self.w_c)

    def waiting(self) -> set[str]:
        return {r.client_id for r in self.engine.scheduler.waiting()}

    def tokens(self, clients) -> dict[str, tuple[int, int, int]]:
        counts = self.engine.client_tokens
        return {
            c: (counts[c].num_input, counts[c].num_output, counts[c].num_cached)
            if c in counts
            else (0, 0, 0)
            for c in clients
        }


def watch_rejoining(engine) -> set[str]:
    """The clients that rejoin the queue during a step (a request preempted when its client
    had nothing else waiting): each left the queue earlier in that step, so it was not
    backlogged throughout it. The caller clears the set before each step."""
    rejoined: set[str] = set()
    preempt: Callable[[Request], None] = engine.preempt

    def watched(request: Request) -> None:
        if all(r.client_id != request.client_id for r in engine.scheduler.waiting()):
            rejoined.add(request.client_id)
        preempt(request)

    engine.preempt = watched
    return rejoined
