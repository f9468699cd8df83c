"""Sampling: greedy, temperature, top-k and top-p on hand-made logits."""

from __future__ import annotations

import pytest
import torch

from minivtc.engine.sampler import SamplingParams, greedy_tokens, sample, sample_each


def sample_row(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
    """One row's token, drawn alone."""
    return sample(logits[None], [p], [gen])[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_tokens_are_torch_argmax_ties_nans_and_infinities_included(dtype):
    """The greedy path's `max(dim).indices` answers as `argmax` does on every row: the first of
    tied maxima (bf16 ties often), a NaN's index, a row of -inf, a row of +inf."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 4096, generator=g).mul(3).round().to(dtype)  # many ties
    logits[1, 7] = logits[1, 4000] = float("nan")
    logits[2] = -float("inf")
    logits[3, [5, 9]] = float("inf")
    expected = logits.argmax(dim=-1).tolist()
    assert greedy_tokens(logits) == expected
    assert expected[1:4] == [7, 0, 5]
    params = [SamplingParams(temperature=0)] * 64
    assert sample(logits, params, [None] * 64) == logits.float().argmax(dim=-1).tolist()


@pytest.mark.parametrize("temperature", [1e-3, 1e-30, 1e-40, 1e-300, 5e-324])
def test_a_tiny_temperature_samples_the_argmax_not_nan(temperature):
    """logits / 1e-40 overflows float32; the sampler must still answer (the argmax), not
    raise from torch.multinomial and take the whole engine loop down."""
    logits = torch.tensor([0.5, 3.0, -1.0, 2.9])
    gen = torch.Generator().manual_seed(0)
    assert sample_row(logits, SamplingParams(temperature=temperature), gen) == 1


def test_top_k_and_top_p_only_ever_pick_the_allowed_tokens():
    logits = torch.tensor([2.0, 1.9, 1.8, -5.0, -6.0])
    gen = torch.Generator().manual_seed(0)
    top_k = {sample_row(logits, SamplingParams(top_k=2), gen) for _ in range(200)}
    assert top_k == {0, 1}
    # Mass of {0, 1, 2} is ~0.999; top_p 0.5 keeps the smallest prefix reaching 0.5: {0, 1}.
    top_p = {sample_row(logits, SamplingParams(top_p=0.5), gen) for _ in range(200)}
    assert top_p == {0, 1}


def test_greedy_rows_and_seeded_rows_are_reproducible():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=0), SamplingParams(seed=7), SamplingParams(seed=7)]
    first = sample(logits, params, [p.generator() for p in params])
    again = sample(logits, params, [p.generator() for p in params])
    assert first == again and first[0] == int(logits[0].argmax())


def test_a_rows_token_never_depends_on_the_rows_beside_it():
    """The draws are batched; each row's token must still be the one it gets alone."""
    logits = torch.randn(9, 300, generator=torch.Generator().manual_seed(3)) * 2
    params = [
        SamplingParams(temperature=t, seed=s, top_k=k, top_p=q)
        for t, s, k, q in [
            (0, None, 0, 1),
            (1.0, 1, 0, 1),
            (0.7, 2, 5, 1),
            (1.3, 3, 0, 0.8),
            (1.0, 4, 0, 1),
            (0, None, 0, 1),
            (2.0, 5, 40, 0.9),
            (0.1, 6, 0, 1),
            (1.0, 7, 0, 1),
        ]
    ]
    for _ in range(20):
        batch = sample(logits, params, [p.generator() for p in params])
        alone = [sample_row(logits[i], p, p.generator()) for i, p in enumerate(params)]
        assert batch == alone
        logits = logits.roll(1, dims=1)


def test_draws_follow_the_distribution():
    """4,000 seeded draws from softmax([0, 1, 2, -inf]): each token's share within 0.03 of its
    probability (deterministic: the seeds are fixed), and the -inf token never."""
    logits = torch.tensor([0.0, 1.0, 2.0, float("-inf")])
    want = torch.softmax(logits, -1)
    params = SamplingParams(temperature=1.0, seed=11)
    gen = params.generator()
    draws = [sample_row(logits, params, gen) for _ in range(4000)]
    share = torch.bincount(torch.tensor(draws), minlength=4) / len(draws)
    assert share[3] == 0 and torch.allclose(share, want, atol=0.03), share


def test_a_row_that_cannot_be_sampled_fails_alone():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(4))
    logits[2, 7] = float("nan")
    params = [SamplingParams(seed=i) for i in range(4)]
    out = sample_each(logits, params, [p.generator() for p in params])
    assert isinstance(out[2], ValueError) and "not a distribution" in str(out[2])
    clean = [sample_row(logits[i], p, p.generator()) for i, p in enumerate(params) if i != 2]
    assert [t for i, t in enumerate(out) if i != 2] == clean
