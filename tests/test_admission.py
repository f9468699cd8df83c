"""Admission policies: the artifact's peak check predicts exactly the most blocks the batch will
hold. (Full reservation is a graded test: minivtc/course/graded/test_a3_batching.py.)"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivtc.engine.admission import PeakReservation
from minivtc.engine.engine import Engine
from minivtc.engine.engine_config import EngineConfig
from minivtc.engine.kv_pool import BlockAllocator
from minivtc.fairness.scheduler import FCFS
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request
from tests.test_engine import ScriptedRunner


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 50), st.integers(0, 50), st.integers(1, 60)),
        min_size=1,
        max_size=12,
    )
)
def test_peak_closed_form_equals_the_general_sum(specs):
    """block_size 1 uses a running sum; it must equal the general per-block formula."""
    peak = PeakReservation(BlockAllocator(10**6, 1))
    requests = []
    for i, (prompt, done, extra) in enumerate(specs):
        r = Request(f"r{i}", "c", [1] * prompt, SamplingParams(max_tokens=done + extra), 0.0)
        r.output_ids = [7] * done
        requests.append(r)
        peak.spans[r.request_id] = peak.span(r)
    candidate = requests[-1]
    del peak.spans[candidate.request_id]
    live = [(r.num_tokens, r.params.max_tokens - r.num_output) for r in requests]
    live.sort(key=lambda x: -x[1])
    general = max(sum(n + left - 1 for n, _ in live[: k + 1]) for k, (_, left) in enumerate(live))
    assert peak.peak_blocks(candidate) == general


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 30), st.integers(1, 30), st.integers(0, 3)),
        min_size=1,
        max_size=10,
    ),
    st.sampled_from([1, 3, 16]),
)
def test_peak_blocks_is_the_most_the_batch_then_holds(specs, block_size):
    """Requests join over a few steps; then `peak_blocks` of one more request must equal the
    most blocks held during any later step, that request included, as the batch runs to the
    end with nobody else joining (no EOS: every request runs to its max_tokens)."""
    held = []

    class Recording(ScriptedRunner):  # blocks held while each step runs (finishes free them)
        def run(self, requests, allocator):
            held.append(allocator.num_used_blocks)
            return super().run(requests, allocator)

    engine = Engine(
        Recording(lambda r: 7),
        BlockAllocator(10**5, block_size),
        FCFS(),
        10**5,
        eos_id=2,
        config=EngineConfig(reservation="peak", check_invariants=True),
    )
    for prompt, max_tokens, wait in specs:
        engine.add_request([1] * prompt, SamplingParams(max_tokens=max_tokens))
        for _ in range(wait):
            engine.step()
    engine.step()  # admit the last ones: peak_blocks counts the running batch
    candidate = engine.add_request([1] * 5, SamplingParams(max_tokens=9))
    predicted = engine.admission.peak_blocks(candidate)
    held.clear()
    while engine.has_unfinished():
        engine.step()  # admits the candidate (the pool is huge), then only runs
    assert predicted == max(held)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 64), st.integers(1, 64)), min_size=1, max_size=8),
    st.sampled_from([1, 4, 16]),
    st.sampled_from([("full", "latest"), ("peak", "latest"), ("none", "latest"), ("none", "fair")]),
)
def test_every_request_the_engine_accepts_finishes(specs, block_size, memory):
    """Liveness: whatever the admission policy, a request that passes validation (prompt +
    max_tokens fits the pool) is admitted and finishes, even one that fills the whole pool
    (on-demand admission must not ask it for headroom it can never use)."""
    pool = 4 * 16
    reservation, victim = memory
    engine = Engine(
        ScriptedRunner(lambda r: 7),
        BlockAllocator(pool // block_size, block_size),
        FCFS(),
        10**5,
        eos_id=2,
        config=EngineConfig(
            reservation=reservation,
            victim=victim if reservation == "none" else None,
            check_invariants=True,
        ),
    )
    requests = []
    for prompt, max_tokens in specs:
        prompt = min(prompt, pool - 1)
        max_tokens = min(max_tokens, pool - prompt)
        requests.append(engine.add_request([1] * prompt, SamplingParams(max_tokens=max_tokens)))
    bound = sum(r.max_num_tokens for r in requests) * 4  # generous: preemption repeats work
    for _ in range(bound):
        if not engine.has_unfinished():
            break
        engine.step()
    assert all(r.is_finished for r in requests), [r for r in requests if not r.is_finished]
