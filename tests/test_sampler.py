"""Sampling: greedy, temperature, top-k and top-p on hand-made logits."""

from __future__ import annotations

import pytest
import torch

from minivtc.engine.sampler import SamplingParams, sample, sample_row


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
