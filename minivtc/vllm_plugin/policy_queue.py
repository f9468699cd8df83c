"""vLLM's waiting queue kept by the package's own policies: `PolicyQueue`, and the options
that choose its policy (`PluginOptions`).

Owns the translation between the calls vLLM's v1 scheduler makes on its waiting queue (its
`RequestQueue`: add, peek, pop, prepend, remove) and the interface minivtc's engine drives a
policy through (`scheduler.py`: add, peek, dispatch, on_decode, on_finish, requeue, remove).
The policy objects are the package's (VTC and its weighted, predicting and profiled variants,
FCFS, DRR), not copies: each vLLM request gets a minivtc `Request` mirror holding its client,
its prompt and its output so far, and the policy only ever sees mirrors.

    vLLM asks the queue             the policy does
    add_request(r)                  add(mirror, now)           (a client joining Q is lifted)
    peek_request()                  peek()
    pop_request()                   dispatch(peek())           (the prompt charged: Algorithm 2)
    prepend_request(r)              requeue(mirror)            (preempted: first of its client's
                                                                queue, charged nothing more)
    prepend_requests(rs)            requeue(mirror) each       (skipped by vLLM's scan, below)
    remove_request(s)(rs)           remove(mirror)             (aborted, or stopped, waiting)
    the scheduler, after a step:
    charge_outputs(rs)              on_decode(mirrors)         (the output tokens vLLM reports)
    finish(r, reason)               on_finish(mirror)

Never skip: the scheduler stops its admission round at the first request that does not fit
(vLLM's own `break` when blocks run short), as Algorithm 2 does. vLLM does set aside a request
that cannot run at all yet (a grammar still compiling, KV still arriving from a connector, a
LoRA slot taken): it pops it and prepends it again after the round. Popped, its prompt was
charged; prepended, it waits first of its client's queue as a preempted request does, and is
not charged again when it runs. None of these arise with the plain models this package serves.

The client is `extra_args["client"]` of the request's SamplingParams (`vllm_xargs` on an
OpenAI request), else `DEFAULT_CLIENT`, the name minivtc's own server gives an unnamed caller.
Imports no vLLM (vLLM's requests are read through the few attributes `VllmRequest` names), so
it is tested without vLLM. `fair_scheduler.py` plugs it into vLLM. Does not own: KV blocks or
running requests (vLLM's). Lesson 15.

The queue's options inside vLLM, `PluginOptions`, come from vLLM's `additional_config`
(`--additional-config '{"minivtc": {...}}'`, or `LLM(additional_config=)`). vLLM builds its
scheduler itself, with its own arguments only; `additional_config` is the free-form part of its
configuration that reaches the engine process, so it carries these:

    policy          a name `make_scheduler` knows: vtc (default), vtc-profile, vtc-predict,
                    vtc-oracle, lcf, fcfs, drr, drr:Q, ... (not rpm:N: vLLM's queue cannot
                    reject a request it has accepted)
    weights         a JSON file of client -> weight (Section 4.3), or none (every weight 1)
    default_client  the client of a request whose extra_args name none ("default")
    check_fairness  assert Lemma 4.3 on the waiting counters after every step (off)
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from minivtc.fairness.fairness_check import FairnessCheck
from minivtc.fairness.policies import make_scheduler
from minivtc.fairness.scheduler import Scheduler
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request, Status

__all__ = ["DEFAULT_CLIENT", "PluginOptions", "PolicyQueue", "mirror_of"]

DEFAULT_CLIENT = "default"  # an unnamed caller, as minivtc's server names one
CLIENT_KEY = "client"  # SamplingParams.extra_args[CLIENT_KEY]: the request's client
CONFIG_KEY = "minivtc"  # additional_config[CONFIG_KEY]: the options (`PluginOptions`)


class VllmSamplingParams(Protocol):
    extra_args: dict[str, Any] | None


class VllmRequest(Protocol):
    """What the queue reads of a vLLM request (`vllm.v1.request.Request`)."""

    request_id: str
    prompt_token_ids: list[int] | None
    arrival_time: float
    max_tokens: int

    @property
    def sampling_params(self) -> VllmSamplingParams | None: ...

    @property
    def output_token_ids(self) -> Sequence[int]: ...


class PolicyQueue:
    """vLLM's waiting queue, ordered by `policy`. `fairness`: a check of Lemma 4.3 run after
    every change to the waiting counters (`watch`); `clock`: arrival times for the policy."""

    def __init__(
        self,
        policy: Scheduler,
        default_client: str = DEFAULT_CLIENT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy, self.default_client, self.clock = policy, default_client, clock
        self.mirrors: dict[str, Request] = {}  # request id -> its mirror, arrival to finish
        self.requests: dict[str, VllmRequest] = {}  # request id -> vLLM's request
        self.queued: set[str] = set()  # request ids in Q: those the policy holds waiting
        self.fairness: FairnessCheck | None = None
        self.num_preemptions = 0  # requests back in Q after a dispatch (preempted or skipped)

    def watch(self, fairness: FairnessCheck) -> None:
        """Assert Lemma 4.3 with `fairness` from now on, until a request is preempted (vLLM's
        victim is the latest request: no bound is stated for it, `fairness_check.py`)."""
        self.fairness = fairness

    # vLLM's RequestQueue

    def add_request(self, request: VllmRequest) -> None:
        if request.request_id in self.mirrors:  # a streaming-input session's next turn
            self.prepend_request(request)  # (its new input is not charged: not supported)
            return
        mirror = mirror_of(request, self.default_client)
        reason = self.policy.add(mirror, self.clock())
        assert reason is None, f"{self.policy.name} rejected a request vLLM had accepted"
        self.mirrors[mirror.request_id], self.requests[mirror.request_id] = mirror, request
        self.queued.add(mirror.request_id)
        self.check_spread()  # its client may have joined Q, lifted

    def peek_request(self) -> VllmRequest:
        head = self.policy.peek()
        if head is None:
            raise IndexError("peek from an empty queue")
        return self.requests[head.request_id]

    def pop_request(self) -> VllmRequest:
        """The head leaves Q for vLLM's running list: dispatched, its prompt charged (once:
        a request back from a preemption was charged at its first dispatch)."""
        head = self.policy.peek()
        if head is None:
            raise IndexError("pop from an empty queue")
        self.policy.dispatch(head)
        self.queued.discard(head.request_id)
        head.status = Status.RUNNING
        if self.fairness is not None:
            self.fairness.dispatched(head)
        return self.requests[head.request_id]

    def prepend_request(self, request: VllmRequest) -> None:
        """Back from vLLM's running list (preempted) or its scan (skipped): first of its
        client's queue, nothing charged or refunded, not charged again at its next dispatch."""
        mirror = self.mirrors[request.request_id]
        assert mirror.status is Status.RUNNING, f"{mirror!r} was not dispatched"
        mirror.status = Status.WAITING
        mirror.num_preemptions += 1  # the policy reads it: charged already
        self.num_preemptions += 1
        self.fairness = None  # the latest victim: no bound stated from here on
        self.policy.requeue(mirror)
        self.queued.add(request.request_id)

    def prepend_requests(self, requests: Iterable[VllmRequest]) -> None:
        """vLLM hands these last-popped first: prepending each in turn restores their order."""
        for request in requests:
            self.prepend_request(request)

    def remove_request(self, request: VllmRequest) -> None:
        self.remove_requests([request])

    def remove_requests(self, requests: Iterable[VllmRequest]) -> None:
        """Out of Q (vLLM also asks for requests this queue does not hold: ignored)."""
        for request in requests:
            if request.request_id in self.queued:
                self.queued.discard(request.request_id)
                self.policy.remove(self.mirrors[request.request_id])

    def __bool__(self) -> bool:
        return bool(self.queued)

    def __len__(self) -> int:
        return len(self.queued)

    def __iter__(self) -> Iterator[VllmRequest]:
        return (self.requests[m.request_id] for m in self.policy.waiting())

    # the scheduler's calls after a step

    def charge_outputs(self, requests: Iterable[VllmRequest]) -> None:
        """Algorithm 2's "c_i <- c_i + the cost of i's new tokens": the tokens vLLM appended
        to `requests` since the last call, one policy call for the step."""
        grown = []
        for request in requests:
            mirror = self.mirrors.get(request.request_id)
            if mirror is None or mirror.status is not Status.RUNNING:
                continue  # finished already, or output that arrived after a preemption
            outputs = request.output_token_ids
            if len(outputs) > len(mirror.output_ids):
                mirror.output_ids.extend(outputs[len(mirror.output_ids) :])
                grown.append(mirror)
        if grown:
            self.policy.on_decode(grown)
        if self.fairness is not None:
            self.fairness.check()

    def finish(self, request: VllmRequest, reason: str) -> None:
        """`request` finished (`reason`: vLLM's, "stop", "length", "abort", ...): the policy
        closes its books if it was dispatched; the mirror is forgotten."""
        if request.request_id not in self.mirrors:
            return
        self.remove_requests([request])  # (vLLM has done so already)
        mirror = self.mirrors.pop(request.request_id)
        del self.requests[request.request_id]
        mirror.finish_reason = reason
        if mirror.status is Status.RUNNING or mirror.num_preemptions:  # dispatched once
            self.policy.on_finish(mirror)
        mirror.status = Status.ABORTED if reason == "abort" else Status.FINISHED

    def check_spread(self) -> None:
        if self.fairness is not None:
            self.fairness.check_spread()


def mirror_of(request: VllmRequest, default_client: str) -> Request:
    """A minivtc `Request` standing for `request`: its id, client, prompt and max_tokens."""
    params = SamplingParams(max_tokens=request.max_tokens)  # (what an Oracle predicts)
    prompt = list(request.prompt_token_ids or [])
    return Request(
        request.request_id, client_of(request, default_client), prompt, params, request.arrival_time
    )


def client_of(request: VllmRequest, default_client: str) -> str:
    """`extra_args["client"]` (`vllm_xargs` on an OpenAI request) as a string, else (absent,
    null or empty) `default_client`. Never raises: vLLM has accepted the request already, and
    an exception here would stop its engine for every client."""
    params = request.sampling_params
    extra = (params.extra_args if params is not None else None) or {}
    client = extra.get(CLIENT_KEY)
    return default_client if client is None or client == "" else str(client)


@dataclass(frozen=True)
class PluginOptions:
    policy: str = "vtc"
    weights: str | None = None  # a JSON file: client -> weight
    default_client: str = DEFAULT_CLIENT
    check_fairness: bool = False

    def __post_init__(self) -> None:
        if self.policy.startswith("rpm"):
            raise ValueError(
                f"{self.policy}: a rate limit rejects requests, and vLLM's waiting queue cannot "
                "reject one vLLM has accepted; choose vtc, fcfs, drr or another of the VTC family"
            )
        if not self.default_client:
            raise ValueError("default_client must name a client")

    @classmethod
    def from_config(cls, additional_config: Any) -> PluginOptions:
        """From vLLM's `additional_config` (a dict; its "minivtc" entry, or the defaults)."""
        given = additional_config.get(CONFIG_KEY, {}) if isinstance(additional_config, dict) else {}
        if not isinstance(given, dict):
            raise ValueError(f'additional_config["{CONFIG_KEY}"] must be an object of options')
        unknown = set(given) - {"policy", "weights", "default_client", "check_fairness"}
        if unknown:
            raise ValueError(f'additional_config["{CONFIG_KEY}"]: unknown {sorted(unknown)}')
        return cls(**given)

    def make_policy(self) -> Scheduler:
        """The policy object, with the weights file's weights."""
        weights = read_weights(Path(self.weights)) if self.weights else None
        return make_scheduler(self.policy, weights=weights)


def read_weights(path: Path) -> dict[str, float]:
    """A JSON object of client -> weight > 0 (finite)."""
    try:
        weights = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read the weights ({e})") from None
    if not isinstance(weights, dict) or not all(
        isinstance(w, (int, float)) and 0 < w < math.inf for w in weights.values()
    ):
        raise ValueError(f"{path}: want an object of client -> weight > 0 (finite)")
    return {str(c): float(w) for c, w in weights.items()}
