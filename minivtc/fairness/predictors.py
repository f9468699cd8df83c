"""Output-length predictors for VTC with length prediction (Section 4.4, Algorithm 3).

Owns: `Predictor` (what VTC asks of one) and three of them: the paper's mean of the client's
last requests, the official artifact's moving average, and the oracle the simulator can offer.
VTC charges h(n_p, predicted) at dispatch and refunds the over-prediction at the end (`vtc.py`).
Plain Python: no tensors. Lesson 8.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Protocol

from minivtc.requests.request import Request

__all__ = ["MeanOfLast", "MovingAverage", "Oracle", "Predictor"]


class Predictor(Protocol):
    def predict(self, request: Request) -> float: ...

    def observe(self, request: Request) -> None: ...


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
        true = request.params.limit
        if not self.spread:
            return float(true)
        return self.rng.uniform(true * (1 - self.spread), true * (1 + self.spread))

    def observe(self, request: Request) -> None:
        pass
