"""The output-length predictors of Algorithm 3 (Section 4.4), on their own: what each predicts
from what it has observed. How VTC charges and refunds a prediction is `test_vtc.py`'s."""

from __future__ import annotations

import pytest

from minivtc.core.predictors import MeanOfLast, MovingAverage, Oracle
from minivtc.core.request import Request
from minivtc.core.sampler import SamplingParams


def test_predictors():
    mean, ema = MeanOfLast(window=5), MovingAverage()
    lengths = [10, 20, 30, 40, 50, 60]
    for i, n in enumerate(lengths):
        r = Request(f"r{i}", "a", [1], SamplingParams(max_tokens=n), 0.0)
        r.output_ids = [1] * n
        mean.observe(r), ema.observe(r)
    probe = Request("p", "a", [1], SamplingParams(), 0.0)
    assert mean.predict(probe) == sum(lengths[-5:]) / 5  # the paper: mean of the last 5
    expect = 10.0
    for n in lengths[1:]:
        expect = (4 * expect + n) / 5
    assert ema.predict(probe) == pytest.approx(expect)  # the artifact's moving average
    spread = Oracle(0.5, seed=3)
    draws = [
        spread.predict(Request("q", "a", [1], SamplingParams(max_tokens=100), 0.0))
        for _ in range(200)
    ]
    assert 50 <= min(draws) and max(draws) <= 150 and max(draws) - min(draws) > 80
