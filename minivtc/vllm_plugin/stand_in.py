"""vLLM's requests and scheduling loop, as far as its waiting queue sees them, without vLLM.

Owns `FakeRequest` (the six attributes of `vllm.v1.request.Request` that `PolicyQueue` reads),
`Loop` (vLLM's admission round and step, calling the queue as vLLM's scheduler does, with
chunked prefill as an option) and `run_overload` (the paper's overload workload, Section 5.2,
on that loop, counted in engine steps). Lesson 15 drives the real `PolicyQueue` and the real
policies through them on a laptop; `overload.py` runs the same workload inside vLLM itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from minivtc.fairness.cost import W_P, W_Q
from minivtc.fairness.fairness_check import FairnessCheck
from minivtc.fairness.policies import make_scheduler
from minivtc.vllm_plugin.policy_queue import PolicyQueue

__all__ = ["FakeRequest", "L_INPUT", "Loop", "MAX_RUNNING", "POOL", "PROMPT", "Params", "request"]
__all__ += ["run_overload"]

POOL, MAX_RUNNING, PROMPT, OUTPUT = 96, 4, 8, 16  # the overload's memory and requests
STEPS, L_INPUT = 400, PROMPT + OUTPUT  # L_INPUT: `max_model_len` bounds any prompt


@dataclass
class Params:
    """vLLM's SamplingParams, as far as the queue reads them."""

    extra_args: dict[str, Any] | None = None


@dataclass
class FakeRequest:
    """vllm.v1.request.Request, as far as the queue reads one."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    sampling_params: Params
    arrival_time: float = 0.0
    output_token_ids: list[int] = field(default_factory=list)


def request(request_id: str, client: str | None, n_prompt: int = 8, n_out: int = 4):
    """A request of `client` (None: it names none) with `n_prompt` prompt tokens."""
    extra = None if client is None else {"client": client}
    return FakeRequest(request_id, [5] * n_prompt, n_out, Params(extra))


class Loop:
    """vLLM's scheduling loop as far as its waiting queue sees it. Each step: admit the head
    while it fits, reserving its whole length (so nothing is ever preempted: Lemma 4.3's
    setting), and stop at the first that does not (vLLM's `break`); give every running request
    one token, its prompt first computed (whole, or `chunk` tokens a step); report the step's
    tokens (`charge_outputs`); close the finished ones. `served` counts service as the paper's
    h, w_p per prompt token *when it is computed* and w_q per output token; `ahead` the most
    service charged to a client (its prompts, at the pop) and not yet computed for it."""

    def __init__(self, queue, pool=POOL, max_running=MAX_RUNNING, chunk=None) -> None:
        self.queue, self.pool, self.max_running, self.chunk = queue, pool, max_running, chunk
        self.running: list[FakeRequest] = []
        self.computed: dict[str, int] = {}  # request id -> prompt tokens computed so far
        self.served: dict[str, float] = {}  # client -> service computed
        self.ahead = 0.0  # the most service charged to a client and not yet computed for it

    def step(self) -> None:
        while self.queue and len(self.running) < self.max_running:
            head = self.queue.peek_request()
            if self.held() + len(head.prompt_token_ids) + head.max_tokens > self.pool:
                break  # never skip to a later request
            self.running.append(self.queue.pop_request())
            self.computed[head.request_id] = 0
        for r in self.running:
            left = len(r.prompt_token_ids) - self.computed[r.request_id]
            if left:  # (chunked) prefill: this step computes part of the prompt, or all of it
                n = left if self.chunk is None else min(self.chunk, left)
                self.computed[r.request_id] += n
                self.serve(r, W_P * n)
                if n < left:
                    continue  # the prompt is not finished: no token yet
            r.output_token_ids.append(7)  # the step that finishes the prompt samples a token
            self.serve(r, W_Q)
        self.queue.charge_outputs(self.running)
        self.ahead = max(self.ahead, max(self.lag().values(), default=0.0))
        for r in [r for r in self.running if len(r.output_token_ids) == r.max_tokens]:
            self.running.remove(r)
            self.queue.finish(r, "length")

    def held(self) -> int:
        return sum(len(r.prompt_token_ids) + r.max_tokens for r in self.running)

    def serve(self, r: FakeRequest, amount: float) -> None:
        client = client_of(r)
        self.served[client] = self.served.get(client, 0.0) + amount

    def lag(self) -> dict[str, float]:
        """client -> prompt charged at dispatch but not computed yet (chunked prefill)."""
        lag: dict[str, float] = {}
        for r in self.running:
            left = len(r.prompt_token_ids) - self.computed[r.request_id]
            lag[client_of(r)] = lag.get(client_of(r), 0.0) + W_P * left
        return lag


def client_of(r: FakeRequest) -> str:
    return (r.sampling_params.extra_args or {})["client"]


def run_overload(policy_name: str, chunk: int | None = None, steps: int = STEPS):
    """The heavy client sends a request every 2 steps, the light one every 4, far more than
    `MAX_RUNNING` requests of `L_INPUT` tokens can serve. For the VTC family the queue asserts
    Lemma 4.3 as the loop runs (`FairnessCheck`). Returns the loop, the queue, each step's
    `served` and the clients waiting after each step."""
    policy = make_scheduler(policy_name)
    queue = PolicyQueue(policy)
    if policy.ledger.keeps_counters:
        queue.watch(FairnessCheck(policy, L_INPUT, POOL, MAX_RUNNING, "full", None))
    loop, history, waiting = Loop(queue, chunk=chunk), [], []
    for step in range(steps):
        for client, every in (("heavy", 2), ("light", 4)):
            if step % every == 0:
                queue.add_request(request(f"{client}{step}", client, PROMPT, OUTPUT))
        loop.step()
        history.append(dict(loop.served))
        waiting.append({r.client_id for r in policy.waiting()})  # who is backlogged now
    return loop, queue, history, waiting
