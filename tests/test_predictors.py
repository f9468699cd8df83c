"""The output-length predictors of Algorithm 3 (Section 4.4), on their own: what each predicts
from what it has observed, client by client. How VTC charges and refunds a prediction is
`test_vtc.py`'s."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minivtc.engine.sampler import SamplingParams
from minivtc.fairness.predictors import MeanOfLast, MovingAverage, Oracle
from minivtc.requests.request import Request


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


def done(client: str, n: int, rid: str = "r") -> Request:
    """A finished request of `client` that generated `n` tokens."""
    r = Request(rid, client, [1], SamplingParams(max_tokens=max(n, 1)), 0.0)
    r.output_ids = [1] * n
    return r


def probe(client: str = "a", max_tokens: int = 16) -> Request:
    return Request("p", client, [1], SamplingParams(max_tokens=max_tokens), 0.0)


@given(st.lists(st.integers(0, 500), max_size=30), st.integers(1, 8))
def test_mean_of_last_is_the_mean_of_the_clients_last_window(lengths, window):
    mean = MeanOfLast(window=window)
    for i, n in enumerate(lengths):
        mean.observe(done("a", n, f"r{i}"))
    last = lengths[-window:]
    assert mean.predict(probe()) == pytest.approx(sum(last) / len(last) if last else 0.0)


@pytest.mark.parametrize("make", [MeanOfLast, MovingAverage])
def test_a_client_with_no_history_is_predicted_zero_and_clients_do_not_mix(make):
    """0 until a request of the client finishes: VTC charges as if it had no predictor."""
    predictor = make()
    assert predictor.predict(probe("a")) == 0.0
    predictor.observe(done("b", 40))
    assert predictor.predict(probe("a")) == 0.0
    assert predictor.predict(probe("b")) == 40.0  # one observation: that length, for both
    predictor.observe(done("a", 10))
    assert predictor.predict(probe("b")) == 40.0


def test_the_prediction_does_not_depend_on_the_request_asked_about():
    """Only the client's history counts, not the request's own max_tokens (only the oracle
    reads that)."""
    mean, ema = MeanOfLast(), MovingAverage()
    for p in (mean, ema):
        p.observe(done("a", 7))
        assert p.predict(probe("a", max_tokens=1)) == p.predict(probe("a", max_tokens=999))


@given(st.integers(1, 2000), st.floats(0.0, 1.0), st.integers(0, 2**32))
def test_the_oracle_draws_within_its_spread(true, spread, seed):
    oracle = Oracle(spread, seed=seed)
    got = oracle.predict(probe(max_tokens=true))
    if spread == 0:
        assert got == float(true)
    else:
        slack = 1e-9 * true  # uniform(a, b) may round to just past b
        assert true * (1 - spread) - slack <= got <= true * (1 + spread) + slack


def test_the_oracle_is_seeded_and_learns_nothing():
    def draws(seed: int, observe: bool) -> list[float]:
        oracle = Oracle(0.5, seed=seed)
        out = []
        for i in range(20):
            if observe:
                oracle.observe(done("a", 3 * i + 1, f"r{i}"))
            out.append(oracle.predict(probe(max_tokens=100)))
        return out

    assert draws(1, observe=False) == draws(1, observe=True)  # what it observes is ignored
    assert draws(1, observe=False) != draws(2, observe=False)
    exact = Oracle()
    exact.observe(done("a", 3))
    assert exact.predict(probe(max_tokens=64)) == 64.0  # max_tokens: EOS ignored, as simulated
