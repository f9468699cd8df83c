"""The rooms one engine step visits: the functions `Engine.step` enters, followed by the
interpreter's profile hook (not by reading the code), from `step` down to the allocator and
back, the runner's forward pass counted as one call and not followed.

Control flows down (`engine.py`): a step that began to call into the serving layer, the
fairness check with checks off, or preemption's books for a request never preempted would
show here as a room it had no business in. `pytest tests/test_step_path.py -s` prints the
path. The third path is the student's real step: the bundled model through the real runner
(`runner.py`), its forward pass followed into the model, attention and the sampler.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import minivtc
from minivtc.engine.engine import Engine
from minivtc.engine.engine_config import EngineConfig
from minivtc.engine.factory import build_engine
from minivtc.engine.kv_pool import BlockAllocator
from minivtc.engine.prefix_cache import PrefixCachingAllocator
from minivtc.fairness.policies import make_scheduler
from minivtc.requests.params import SamplingParams
from minivtc.sim.simulator import StepTimeRunner, VirtualClock
from minivtc.sim.step_time import step_time_model

PACKAGE = Path(minivtc.__file__).parent

# VTC, full reservation (the course's proof condition), no prefix cache, checks off: Algorithm 2.
PAPER_ROOMS = {
    "engine/engine.py",
    "fairness/scheduler.py",  # the admission round, Algorithm 2's loop
    "engine/admission.py",
    "engine/kv_pool.py",
    "fairness/vtc.py",
    "fairness/least_counter.py",
    "fairness/cost.py",
    "requests/request.py",
    "requests/params.py",
    "engine/text.py",
    "sim/simulator.py",  # the runner (its step-time model not followed) and the virtual clock
}
# Blocks on demand, the fair victim and a prefix cache: the prefix-caching allocator and the
# fair lift too.
FAIR_MEMORY_ROOMS = PAPER_ROOMS | {"engine/prefix_cache.py", "fairness/fair_lift.py"}


# The student's real step (`build_engine`: VTC, full reservation; the bundled model on the
# CPU): Algorithm 2's rooms with the simulator's runner replaced by the real one, and what its
# forward pass and sampling enter: the model (its rotary table made at the first step, so the
# traced step, the second, does not read the config), attention, the sampler (its penalties
# and log-probabilities each asked, none needed here), the tokenizer's detokenizer.
REAL_ROOMS = (PAPER_ROOMS - {"sim/simulator.py"}) | {
    "engine/runner.py",
    "model/llama.py",
    "model/attention.py",
    "engine/sampler.py",
    "model/tokenizer.py",
}


def step_path(options: EngineConfig, pool: BlockAllocator) -> dict[str, list[str]]:
    """One simulated step that admits a request and finishes another: file -> functions."""
    clock = VirtualClock()
    runner = StepTimeRunner(step_time_model("a10g-llama7b"), clock)
    scheduler = make_scheduler("vtc")
    engine = Engine(runner, pool, scheduler, 1 << 20, eos_id=2, clock=clock, config=options)
    return traced_step(engine, "StepTimeRunner.run")


def traced_step(engine: Engine, not_followed: str | None) -> dict[str, list[str]]:
    """Admit a's request, step, then trace the step that admits b's and finishes a's."""
    engine.add_request(list(range(10, 18)), SamplingParams(max_tokens=2, ignore_eos=True), "a")
    engine.step()
    engine.add_request(list(range(20, 28)), SamplingParams(max_tokens=3, ignore_eos=True), "b")
    entered: dict[str, list[str]] = {}
    inside_runner = 0  # > 0: within `not_followed` (the simulated forward pass)

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal inside_runner
        code = frame.f_code
        if event == "call":
            if inside_runner:
                inside_runner += 1
                return
            path = Path(code.co_filename)
            if path.is_relative_to(PACKAGE):
                names = entered.setdefault(path.relative_to(PACKAGE).as_posix(), [])
                if code.co_qualname not in names:
                    names.append(code.co_qualname)
            inside_runner = int(code.co_qualname == not_followed)
        elif event == "return" and inside_runner:
            inside_runner -= 1

    sys.setprofile(hook)
    try:
        ran = engine.step()
    finally:
        sys.setprofile(None)
    assert {r.client_id for r in ran} == {"a", "b"}, "the step ran both clients' requests"
    assert [r.client_id for r in ran if r.finish_reason] == ["a"], "and finished a's"
    return entered


@pytest.mark.parametrize(
    ("options", "pool", "rooms"),
    [
        (EngineConfig(reservation="full"), BlockAllocator(64, 4), PAPER_ROOMS),
        (
            EngineConfig(reservation="none", victim="fair"),
            PrefixCachingAllocator(64, 4),
            FAIR_MEMORY_ROOMS,
        ),
    ],
    ids=["paper", "fair-memory"],
)
def test_a_step_visits_only_its_rooms(
    options: EngineConfig, pool: BlockAllocator, rooms: set[str]
) -> None:
    entered = step_path(replace(options, check_invariants=False, check_fairness=False), pool)
    assert_rooms(entered, rooms)


def test_the_real_step_visits_only_its_rooms(bundled) -> None:
    """The student's step: the bundled model through the real runner, followed all the way."""
    model, tokenizer = bundled
    engine = build_engine(model, tokenizer, "vtc", kv_tokens=64, block_size=4)
    assert_rooms(traced_step(engine, None), REAL_ROOMS)


def assert_rooms(entered: dict[str, list[str]], rooms: set[str]) -> None:
    functions = sum(len(names) for names in entered.values())
    print(f"\n{functions} functions in {len(entered)} files:")
    for path, names in entered.items():
        print(f"  {path}: {', '.join(names)}")
    assert set(entered) == rooms
    assert "Engine.step" in entered["engine/engine.py"]
    freed = [n for names in entered.values() for n in names if n.endswith("Allocator.free")]
    assert freed, "down to the allocator: the finished request's blocks freed"
