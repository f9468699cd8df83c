"""minivtc/vllm_plugin/stand_in.py: vLLM's loop without vLLM, driving the real PolicyQueue and
policies (Lesson 15); and what overload.py reads without vLLM (the README's numbers)."""

from __future__ import annotations

from minivtc.fairness.cost import W_P
from minivtc.fairness.vtc import VTC
from minivtc.vllm_plugin.overload import recorded, vllm_version
from minivtc.vllm_plugin.policy_queue import PolicyQueue
from minivtc.vllm_plugin.stand_in import MAX_RUNNING, PROMPT, Loop, request, run_overload


def test_the_overload_splits_two_to_one_under_fcfs_and_evenly_under_vtc_for_the_same_work():
    fcfs, vtc = run_overload("fcfs", steps=200), run_overload("vtc", steps=200)
    ratio = {n: r[0].served["heavy"] / r[0].served["light"] for n, r in (("f", fcfs), ("v", vtc))}
    assert 1.8 < ratio["f"] < 2.2 and 0.9 < ratio["v"] < 1.1
    assert sum(fcfs[0].served.values()) == sum(vtc[0].served.values())
    assert fcfs[1].fairness is None and vtc[1].fairness is not None  # VTC checked to the end
    assert len(vtc[2]) == len(vtc[3]) == 200 and vtc[3][-1] == {"heavy", "light"}


def test_the_loop_stops_at_the_first_request_that_does_not_fit_and_never_skips():
    queue = PolicyQueue(VTC())
    for r in (request("a1", "a", 40, 10), request("b1", "b", 40, 10), request("c1", "c", 1, 1)):
        queue.add_request(r)
    loop = Loop(queue, pool=60)
    loop.step()  # a1 holds 50 of 60; b1 (50) does not fit, and c1 (2) may not pass it
    assert [r.request_id for r in loop.running] == ["a1"]
    assert [r.request_id for r in queue] == ["b1", "c1"]


def test_chunked_prefill_runs_the_charge_ahead_of_the_computed_prompt_within_a_prompt_each():
    whole, chunked = run_overload("vtc", steps=100)[0], run_overload("vtc", chunk=3, steps=100)[0]
    assert whole.ahead == 0 and 0 < chunked.ahead <= MAX_RUNNING * W_P * PROMPT


def test_the_readme_s_recorded_overload_and_whether_vllm_imports():
    rows, ratios = recorded()
    assert rows.startswith("| vLLM") and len(rows.splitlines()) == 4
    assert 1.7 < ratios["its own scheduler (FCFS)"] < 2.3
    assert 0.85 < ratios["`FairScheduler`, VTC"] < 1.15
    version, why = vllm_version()
    assert (version is None) == bool(why)
