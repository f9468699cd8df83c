"""The simulator's step-time models (`step_time.py`): the shape of a step, the roofline's
max(compute, memory) + overhead, the measured model's file, and the names that pick one.
(Fitting the measured model is `test_sim.py`'s.)"""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minivtc.engine.sampler import SamplingParams
from minivtc.requests.request import Request
from minivtc.sim import step_time
from minivtc.sim.step_time import (
    STEP_TIME_MODELS,
    MeasuredStepTime,
    Roofline,
    StepShape,
    step_time_model,
)

shapes = st.builds(StepShape, st.integers(0, 10**5), st.integers(0, 512), st.integers(0, 10**6))


def running(n_prompt: int, n_output: int, computed: int) -> Request:
    r = Request("r", "a", [1] * n_prompt, SamplingParams(max_tokens=64), 0.0)
    r.output_ids, r.num_computed = [1] * n_output, computed
    return r


def test_a_step_prefills_only_the_newly_admitted():
    new = running(10, 0, computed=0)  # admitted this step: its prompt is computed now
    decoding = running(20, 5, computed=24)  # its last token is computed now
    assert StepShape.of([new, decoding]) == StepShape(10, 2, 10 + 25)
    assert StepShape.of([decoding]) == StepShape(0, 1, 25)
    assert StepShape.of([]) == StepShape(0, 0, 0)


def test_a_readmitted_request_prefills_its_output_too():
    """After a preemption's reset (num_computed = 0) the next step recomputes prompt + output."""
    assert StepShape.of([running(10, 3, computed=0)]) == StepShape(13, 1, 13)


@given(shapes)
def test_roofline_is_the_larger_of_compute_and_memory_plus_the_overhead(shape):
    """Units chosen so each side reads off the shape: compute time = tokens (prefill tokens plus
    one per request), memory time = weights + K/V read (context tokens)."""
    model = Roofline(
        "toy",
        num_params=1.0,
        weight_bytes=7.0,
        kv_bytes_per_token=1.0,
        bandwidth=1.0,
        flop_rate=2.0,
        overhead_s=0.5,
    )
    compute = shape.prefill_tokens + shape.num_requests
    memory = 7.0 + shape.context_tokens
    assert model.step_time(shape) == 0.5 + max(compute, memory)


def test_a_7b_fp16_model_holds_half_a_mib_of_kv_per_token():
    """K and V, 32 layers of 4096 fp16 values each: 2 * 32 * 4096 * 2 bytes."""
    a10g = STEP_TIME_MODELS["a10g-llama7b"]
    assert a10g.kv_bytes_per_token == 512 * 1024
    assert a10g.weight_bytes == 2 * a10g.num_params


@pytest.mark.parametrize("name", list(STEP_TIME_MODELS))
@given(shape=shapes, more=st.integers(0, 1000))
def test_a_bigger_step_never_takes_less_time(name, shape, more):
    model = STEP_TIME_MODELS[name]
    base = model.step_time(shape)
    assert base >= model.overhead_s > 0
    for bigger in (
        StepShape(shape.prefill_tokens + more, shape.num_requests, shape.context_tokens),
        StepShape(shape.prefill_tokens, shape.num_requests + more, shape.context_tokens),
        StepShape(shape.prefill_tokens, shape.num_requests, shape.context_tokens + more),
    ):
        assert model.step_time(bigger) >= base


def test_measured_step_time_is_its_formula():
    """overhead + a P + b B + c C + d B^2 + e C^2; without the squares, linear in the shape."""
    m = MeasuredStepTime(
        "m",
        overhead_s=1.0,
        per_prefill_token_s=10.0,
        per_request_s=100.0,
        per_context_token_s=1000.0,
    )
    assert m.step_time(StepShape(2, 3, 4)) == pytest.approx(1 + 20 + 300 + 4000)
    squared = dataclasses.replace(m, per_request_squared_s=0.5, per_context_token_squared_s=0.25)
    assert squared.step_time(StepShape(2, 3, 4)) == pytest.approx(1 + 20 + 300 + 4000 + 4.5 + 4)


def test_measured_step_time_round_trips_through_its_file(tmp_path):
    m = MeasuredStepTime("cpu", 0.01, 2e-5, 3e-4, 4e-7, machine="a laptop")
    path = m.save(tmp_path / "deep" / "er" / "m.json")  # parents are made
    assert MeasuredStepTime.load(path) == m == MeasuredStepTime.load(str(path))
    assert json.loads(path.read_text())["machine"] == "a laptop"


def test_step_time_model_by_name(tmp_path, monkeypatch):
    for name, preset in STEP_TIME_MODELS.items():
        assert step_time_model(name) is preset and preset.name == name
    measured = MeasuredStepTime("here", 0.01, 2e-5, 3e-4, 4e-7).save(tmp_path / "here.json")
    assert step_time_model(str(measured)) == MeasuredStepTime.load(measured)
    monkeypatch.setattr(step_time, "DEFAULT_PATH", measured)
    assert step_time_model("measured") == MeasuredStepTime.load(measured)


def test_step_time_model_errors_say_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown step-time model 'a10g'") as e:
        step_time_model("a10g")
    assert all(name in str(e.value) for name in [*STEP_TIME_MODELS, "'measured'", ".json"])
    monkeypatch.setattr(step_time, "DEFAULT_PATH", tmp_path / "none.json")
    for name in ("measured", str(tmp_path / "missing.json")):
        with pytest.raises(FileNotFoundError, match="run `minivtc calibrate` first"):
            step_time_model(name)
