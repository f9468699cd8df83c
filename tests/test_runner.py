"""The runner's fast path: torch.compile'd attention gives the same tokens as the eager path."""

from __future__ import annotations

import pytest
import torch

from minivtc.engine.factory import build_engine
from minivtc.engine.runner import bucket
from minivtc.engine.sampler import SamplingParams
from minivtc.model.llama import Llama
from tests.conftest import TINY_GQA


def test_bucket_is_next_power_of_two():
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 17, 64, 65)] == [1, 2, 4, 4, 8, 32, 64, 128]


def generate(model, compiled: bool):
    engine = build_engine(
        model, None, kv_tokens=400, block_size=4, compile_attention=compiled, check_invariants=True
    )
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    reqs = [engine.add_request(p, params) for p in ([5, 6, 7], [9] * 11)]
    engine.step()
    reqs.append(engine.add_request([4, 3, 2, 1, 8], params))  # joins mid-flight: a mixed step
    while engine.has_unfinished():
        engine.step()
    return [r.output_ids for r in reqs]


@pytest.mark.slow
def test_compiled_attention_gives_the_eager_tokens():
    torch.manual_seed(0)
    model = Llama(TINY_GQA).eval()
    assert generate(model, compiled=True) == generate(model, compiled=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_attention_on_cuda_matches_cpu():
    torch.manual_seed(0)
    model = Llama(TINY_GQA).eval()
    cpu = generate(model, compiled=False)
    assert generate(model.cuda(), compiled=True) == cpu
