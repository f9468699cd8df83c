"""The cost h and the bound U (`cost.py`): the paper's weights, the artifact's profiled h refitted
from its own measurements, the per-token charging rule, and Lemma 4.3's U."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minivtc.fairness.cost import PAPER_COST, W_P, W_Q, LinearCost, ProfiledCost, fairness_bound
from minivtc.sim.workloads import DATA_DIR

COSTS = [LinearCost(), ProfiledCost()]
lengths = st.integers(0, 4096)


def test_the_paper_prices_an_output_token_at_twice_a_prompt_token():
    """Section 3.1: w_p = 1, w_q = 2, the default everywhere."""
    assert (W_P, W_Q) == (1.0, 2.0)
    assert PAPER_COST == LinearCost() == LinearCost(w_p=1.0, w_q=2.0)


@given(lengths, lengths)
def test_linear_cost_is_w_p_n_p_plus_w_q_n_q(n_p, n_q):
    assert LinearCost()(n_p, n_q) == n_p + 2 * n_q
    assert LinearCost(w_p=3.0, w_q=0.5)(n_p, n_q) == 3 * n_p + 0.5 * n_q


def test_the_profiled_cost_is_the_least_squares_fit_of_the_artifacts_a10g_profile():
    """Appendix B.2: h(x, y) = a x + b y + c x y + d y^2 + e, least squares on the prefill +
    decode milliseconds stored for each (input, output) point. Refitting gives our h back."""
    profile = json.loads((DATA_DIR / "a10g_cost_profile.json").read_text())
    points = [
        (float(x), float(y), (prefill_s + decode_s) * 1000)
        for x, by_output in profile.items()
        for y, (_, prefill_s, decode_s) in by_output.items()
    ]
    terms = np.array([[x, y, x * y, y * y, 1.0] for x, y, _ in points])
    fit, *_ = np.linalg.lstsq(terms, np.array([ms for *_, ms in points]), rcond=None)
    for x, y in [(1, 1), (8, 256), (512, 64), (300, 500), (2000, 10)]:
        assert ProfiledCost()(x, y) == pytest.approx(fit @ [x, y, x * y, y * y, 1.0], rel=1e-6)


def test_the_profiled_costs_linear_terms_are_its_w_p_and_w_q():
    """The cached discount and the default preemption gap read w_p and w_q off the cost: for
    the profiled h they must be its linear coefficients. h(x, y) is linear in x at y = 0,
    quadratic in y at x = 0. (U is not sized from them: `ProfiledCost.spread_bound`.)"""
    h = ProfiledCost()
    assert h(1, 0) - h(0, 0) == pytest.approx(h.w_p, rel=1e-9)
    assert h(2, 0) - h(1, 0) == pytest.approx(h.w_p, rel=1e-9)
    linear_in_y = (4 * h(0, 1) - 3 * h(0, 0) - h(0, 2)) / 2  # b of a + b y + c y^2
    assert linear_in_y == pytest.approx(h.w_q, rel=1e-6)


@pytest.mark.parametrize("cost", COSTS, ids=["linear", "profiled"])
@given(lengths, st.integers(0, 600))
def test_per_token_charges_sum_to_h(cost, n_p, n_q):
    """Section 4.2: h(n_p, 0) at dispatch, then h(n_p, k) - h(n_p, k - 1) for the k-th output
    token; together, h(n_p, n_q). Each piece is >= 0 (h is non-decreasing)."""
    pieces = [cost(n_p, 0)] + [cost(n_p, k) - cost(n_p, k - 1) for k in range(1, n_q + 1)]
    assert all(p >= 0 for p in pieces)
    assert sum(pieces) == pytest.approx(cost(n_p, n_q), rel=1e-9)
    if isinstance(cost, LinearCost):
        assert pieces[1:] == [W_Q] * n_q  # the linear h: w_q per output token


@pytest.mark.parametrize("cost", COSTS, ids=["linear", "profiled"])
@given(lengths, lengths, st.integers(0, 100), st.integers(0, 100))
def test_h_is_non_decreasing_in_both_lengths(cost, n_p, n_q, more_p, more_q):
    """Section 4.2 asks this of any h: more tokens never cost less."""
    assert cost(n_p + more_p, n_q) >= cost(n_p, n_q) <= cost(n_p, n_q + more_q)


@given(st.integers(1, 10**6), st.integers(1, 10**6), st.floats(0.01, 100), st.floats(0.01, 100))
def test_u_is_the_papers_for_w_p_at_most_w_q_and_ours_above(max_input, pool_tokens, w_p, w_q):
    """Lemma 4.3's U = max(w_p L_input, w_q M) for w_p <= w_q; above, the most a dispatch at
    the smallest counter and the tokens generated after it can add, w_p n + w_q (M - n) at
    n = min(L_input, M) (ours; `test_bounds.py` runs it)."""
    u = fairness_bound(max_input, pool_tokens, w_p, w_q)
    n = min(max_input, pool_tokens)
    if w_p <= w_q:
        assert u == max(w_p * max_input, w_q * pool_tokens)
    else:
        assert u == pytest.approx(max(w_p * max_input, w_p * n + w_q * (pool_tokens - n)))
    assert fairness_bound(max_input, pool_tokens) == max(max_input, 2 * pool_tokens)


def test_cost_is_a_leaf_module():
    """It imports nothing of the package (and no torch): everything can price service alike."""
    script = textwrap.dedent("""
        import sys
        import minivtc.fairness.cost
        ours = sorted(m for m in sys.modules if m.startswith("minivtc"))
        assert ours == ["minivtc", "minivtc.fairness", "minivtc.fairness.cost"], ours
        assert "torch" not in sys.modules
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@given(st.integers(2, 20_000), st.data())
def test_the_profiled_hs_largest_token_charge_is_at_an_empty_prompt_and_a_full_pool(m, data):
    """`ProfiledCost.spread_bound`'s mu: the n_q-th token of a request that fits in M tokens
    (n_p + n_q <= M) is charged at most h(0, M) - h(0, M - 1)."""
    h = ProfiledCost()
    n_q = data.draw(st.integers(1, m))
    n_p = data.draw(st.integers(0, m - n_q))
    assert h(n_p, n_q) - h(n_p, n_q - 1) <= h(0, m) - h(0, m - 1) + 1e-9
