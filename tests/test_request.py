"""A request: its token arithmetic, what the next step computes, its lifecycle, its repr.

Plain Python values only (no model, no engine): the engine's contract with `Request` is that a
step computes `uncomputed_ids()` at positions `num_computed .. num_tokens - 1` (`runner.py`),
then sets `num_computed = num_tokens` and appends the sampled token (`engine.py`).
"""

from __future__ import annotations

import pytest

from minivtc.engine.sampler import SamplingParams
from minivtc.requests.request import Request, Status


def make(prompt=(11, 12, 13), output=(), max_tokens=5, **kw) -> Request:
    return Request(
        "r1",
        "alice",
        list(prompt),
        SamplingParams(max_tokens=max_tokens),
        arrival_time=1.5,
        output_ids=list(output),
        **kw,
    )


def test_a_new_request_waits_with_nothing_computed():
    r = make()
    assert r.status is Status.WAITING and not r.is_finished
    assert r.num_computed == 0 and r.output_ids == [] and r.text == ""
    assert (r.admitted_time, r.first_token_time, r.finish_time) == (None, None, None)
    assert (r.finish_reason, r.error) == (None, None)


@pytest.mark.parametrize(
    "num_prompt,num_output,max_tokens", [(1, 0, 1), (3, 0, 5), (3, 2, 5), (7, 4, 16)]
)
def test_token_counts(num_prompt, num_output, max_tokens):
    r = make(range(100, 100 + num_prompt), range(num_output), max_tokens)
    assert r.num_prompt == num_prompt and r.num_output == num_output
    assert r.num_tokens == num_prompt + num_output == len(r.all_ids)
    # admission reserves the prompt and every token it may generate, however many exist now
    assert r.max_num_tokens == num_prompt + max_tokens


def test_all_ids_is_prompt_then_output_and_a_copy():
    r = make(output=[7, 8])
    ids = r.all_ids
    assert ids == [11, 12, 13, 7, 8]
    ids.append(99)  # a caller's list: the request's own lists are untouched
    assert r.prompt_ids == [11, 12, 13] and r.output_ids == [7, 8] and r.num_tokens == 5


@pytest.mark.parametrize("num_output", [0, 1, 3])
def test_uncomputed_ids_are_all_ids_after_num_computed(num_output):
    """Whatever `num_computed` is (0 at admission or after a preemption, partway through the
    prompt, all of it), the next step computes the rest of `all_ids`, one per position the
    runner gives it."""
    r = make(output=range(200, 200 + num_output))
    for n in range(r.num_tokens + 1):
        r.num_computed = n
        assert r.uncomputed_ids() == r.all_ids[n:], n
        assert len(r.uncomputed_ids()) == len(range(r.num_computed, r.num_tokens))


def test_uncomputed_ids_through_a_lifecycle_with_a_preemption():
    r = make(max_tokens=3)
    assert r.uncomputed_ids() == [11, 12, 13]  # waiting: the whole prompt
    r.status = Status.RUNNING
    assert r.uncomputed_ids() == [11, 12, 13]  # admitted: prefill computes the prompt
    r.num_computed = r.num_tokens  # the step ran...
    r.output_ids.append(7)  # ...and sampled a token, not yet computed
    assert r.uncomputed_ids() == [7]  # decode: one token
    r.num_computed = r.num_tokens
    r.output_ids.append(8)
    assert r.uncomputed_ids() == [8]
    # a preemption frees the blocks: the next admission recomputes prompt + output so far
    r.status, r.num_computed = Status.WAITING, 0
    assert r.uncomputed_ids() == [11, 12, 13, 7, 8]
    r.status, r.num_computed = Status.RUNNING, r.num_tokens
    r.output_ids.append(9)
    assert r.uncomputed_ids() == [9] and r.num_output == r.params.max_tokens


def test_decode_computes_one_token_per_step():
    r = make(max_tokens=6)
    computed = []
    while r.num_output < r.params.max_tokens:
        new = r.uncomputed_ids()
        computed += new
        r.num_computed = r.num_tokens
        r.output_ids.append(100 + r.num_output)
        assert len(new) == (r.num_prompt if r.num_output == 1 else 1)
    # every token but the last sampled one went through the model exactly once, in order
    assert computed == r.all_ids[:-1]


IS_FINISHED = {
    Status.WAITING: False,
    Status.RUNNING: False,
    Status.FINISHED: True,
    Status.ABORTED: True,
}


def test_is_finished_covers_every_status():
    assert set(IS_FINISHED) == set(Status)  # a new status needs a decision here


@pytest.mark.parametrize("status", list(Status), ids=lambda s: s.value)
def test_is_finished(status):
    assert make(status=status).is_finished is IS_FINISHED[status]


def test_repr_is_one_readable_line_without_token_lists():
    r = make(prompt=range(1000, 3000), output=[5, 6], max_tokens=64, num_computed=2001)
    r.status = Status.RUNNING
    text = repr(r)
    assert text == (
        "Request('r1', client='alice', running, prompt=2000, output=2/64, computed=2001)"
    )
    assert "\n" not in text and "tensor" not in text.lower() and "1000" not in text


def test_requests_are_plain_python_with_slots():
    r = make()
    assert not hasattr(r, "__dict__")  # slots: a simulation holds up to a million of them
    for name in ("prompt_ids", "output_ids"):
        assert all(type(t) is int for t in getattr(r, name))
    a, b = (Request(i, "c", [1], SamplingParams(), 0.0) for i in ("a", "b"))
    a.output_ids.append(2)
    assert b.output_ids == []  # each request has its own output list
