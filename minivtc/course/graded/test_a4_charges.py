"""Assignment a4, graded (1 of 3): what each request is charged (Lesson 5).

Graded by mechanism (`assignments.A4_RUBRIC`): exact counters against Algorithm 2's arithmetic
on small hand-built cases under the linear cost: the prompt charged at dispatch, each output
token charged to its own client. The profiled cost, prediction and refunds, weights (Lesson 8),
readmission (10) and cached tokens (13) are a4b's (`test_a4b_variants.py`,
`test_a4b_memory.py`). The pick and the lift are `test_a4_pick.py`'s; the theorems on
workloads, `test_a4_theorems.py`'s. Requests are moved as the engine moves them
(`vtc_moves.py`)."""

from __future__ import annotations

from minivtc.course.graded.driver import W_P, W_Q
from minivtc.course.graded.vtc_moves import (
    dispatch_next,
    request,
)
from minivtc.fairness.vtc import VTC

__all__ = []


def test_dispatch_charges_the_prompt_at_once():
    """dispatch charges the prompt, h(n_p, 0), to its client's counter at once."""
    vtc = VTC()
    vtc.add(request("a", 10), 0.0)
    dispatch_next(vtc)
    assert vtc.counters["a"] == W_P * 10, (
        f"after dispatching a 10-token prompt the counter is {vtc.counters['a']}, not "
        f"h(10, 0) = {W_P * 10}"
    )


def test_each_output_token_is_charged_to_its_own_client():
    """A step that decodes several clients' requests charges each token to its own client."""
    vtc = VTC()
    ra, rb = request("a", 10), request("b", 4)
    for r in (ra, rb):
        vtc.add(r, 0.0)
    dispatch_next(vtc), dispatch_next(vtc)  # a: 10, b: 4
    for _ in range(3):
        for r in (ra, rb):
            r.output_ids.append(1)
        vtc.on_decode([ra, rb])
    got = {c: vtc.counters[c] for c in "ab"}
    want = {"a": W_P * 10 + W_Q * 3, "b": W_P * 4 + W_Q * 3}
    assert got == want, (
        f"a (10 prompt tokens) and b (4) decoded 3 tokens each, in the same steps: counters "
        f"{got}, not {want} (VTC.on_decode, once a step, and charge_outputs: each request's "
        "tokens go to its own client, once)"
    )
