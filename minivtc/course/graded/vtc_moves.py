"""The engine's moves on a VTC, made by hand for a4's graded tests: a request made, dispatched,
decoded, preempted and finished as the engine does it (status and finish_reason both), fair
preemption set up through the engine's own call, and two stand-in predictors. Owns no test.
"""

from __future__ import annotations

from minivtc.engine.engine_config import EngineConfig
from minivtc.engine.kv_pool import BlockAllocator
from minivtc.engine.preemption import make_victim
from minivtc.fairness.vtc import VTC
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request, Status

__all__ = ["Fixed", "Recording", "decode", "dispatch_next", "finish", "preempt", "request"]
__all__ += ["with_fair_preemption"]


def request(client: str, prompt: int, max_tokens: int = 50, name: str = "") -> Request:
    """A waiting request, as the engine's `add_request` makes one."""
    return Request(
        name or f"{client}{prompt}",
        client,
        [1] * prompt,
        SamplingParams(max_tokens=max_tokens),
        0.0,
    )


def dispatch_next(vtc: VTC) -> Request:
    """The engine's admission of the peeked request: running, then dispatched."""
    r = vtc.peek()
    assert r is not None, "peek() gave None while requests were waiting: check VTC.peek"
    r.status = Status.RUNNING
    vtc.dispatch(r)
    return r


def decode(vtc: VTC, r: Request, tokens: int) -> None:
    for _ in range(tokens):
        r.output_ids.append(1)
        vtc.on_decode([r])


def finish(vtc: VTC, r: Request, reason: str = "eos") -> None:
    """The engine's end of a request: its status and finish_reason both, then on_finish."""
    r.end(Status.ABORTED if reason == "abort" else Status.FINISHED, reason, 0.0)
    vtc.on_finish(r)


def with_fair_preemption(vtc: VTC, gap: float, pool_tokens: int) -> VTC:
    """`vtc` as the engine sets it up for fair preemption (blocks on demand, the fair victim
    with this gap, a pool of `pool_tokens`): through the engine's own call, not VTC's insides."""
    config = EngineConfig(reservation="none", victim="fair", preempt_gap=gap)
    make_victim(config, vtc, BlockAllocator(pool_tokens, 1))
    return vtc


def preempt(vtc: VTC, r: Request) -> None:
    """The engine's preemption of running `r`: waiting again, counted, requeued."""
    r.status = Status.WAITING
    r.num_preemptions += 1
    vtc.requeue(r)


class Recording:
    """A predictor that predicts 8 tokens and records what it was taught."""

    def __init__(self) -> None:
        self.observed: list[str] = []

    def predict(self, request: Request) -> float:
        return 8.0

    def observe(self, request: Request) -> None:
        self.observed.append(request.request_id)


class Fixed:
    """A predictor that always predicts `tokens` tokens."""

    def __init__(self, tokens: float) -> None:
        self.tokens = tokens

    def predict(self, request: Request) -> float:
        return self.tokens

    def observe(self, request: Request) -> None:
        pass
