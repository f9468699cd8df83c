"""Step-time models: how long one engine step takes on a given GPU, from the step's shape.

Owns: `StepShape` (what a step computes: prefill tokens, requests, context tokens), the
`StepTimeModel` interface, `Roofline`, `MeasuredStepTime` (a step's time from its shape,
linear terms and two squares, fitted by `calibrate.py`), the presets (`STEP_TIME_MODELS`)
and `step_time_model(name)`. The simulator (`simulator.py`) advances its virtual clock by these;
they say how long a step takes, not what service a client received (that is the cost h,
`cost.py`). Lessons 4-8.

- `Roofline`: a step reads every weight once and each running request's K/V (memory time)
  and does 2 * params FLOPs per token (compute time); it takes the larger, plus a fixed
  per-step overhead. Presets for A10G/A100/H100/H200 use datasheet bandwidth and FLOP rates
  scaled by achievable fractions (documented per preset).
- `a10g-llama7b`: the roofline form for Llama-2-7B fp16 on an A10G, its efficiencies and
  per-step overhead calibrated so the simulation reproduces the artifact's measured A10G runs
  (`data/a10g_runs`). The artifact's own profile (`data/a10g_cost_profile.json`) gives the
  relative cost h the paper charges with, but its absolute step times are far below what the
  measured runs achieved (both in `minivtc/bench/README.md`), so it cannot time a step.
- `a100-llama13b`: Llama-2-13B fp16 on an A100-80G as the artifact's server ran it for the
  ablation of Section 5.4 (Figure 15): a `MeasuredStepTime` fitted to the per-request
  latencies of its four measured runs, two pool sizes (`data/a100_runs`, `calibrate.fit_runs`;
  the coefficients are `data/a100_step_time.json`). Its step grows with the square of its
  batch and of its context, not linearly (fitted to one pool's runs, the linear form times
  the other pool's steps too fast; the squares come close: how close, in
  `minivtc/bench/README.md`). Its step times include what the artifact's separate prefill
  passes cost (lessons/artifact_deviations.md). `a100-llama13b-roofline` is the datasheet
  estimate it replaced, too fast on those runs.
- `measured`: this machine running the bundled model (`calibrate.py`), so a simulation of the
  tiny model can be set beside a real run of it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from minivtc.requests.request import Request

__all__ = ["A100_FIT", "A100_RUNS", "DEFAULT_PATH", "MeasuredStepTime", "Roofline"]
__all__ += ["STEP_TIME_MODELS", "SWAP_S_PER_TOKEN", "StepShape", "StepTimeModel", "step_time_model"]

DEFAULT_PATH = Path.home() / ".cache" / "minivtc" / "measured_cost.json"
# The artifact's measured runs of the ablation (Section 5.4), and the A100 step time fitted to
# them (`calibrate.fit_runs` writes it)
A100_RUNS = Path(__file__).resolve().parents[1] / "data" / "a100_runs"
A100_FIT = A100_RUNS.parent / "a100_step_time.json"


@dataclass(frozen=True)
class MeasuredStepTime:
    """A step's time fitted to measurements (`calibrate.py`), for a step of P prefill tokens,
    B requests and C context tokens (`StepShape`):

        time = overhead + a P + b B + c C + d B^2 + e C^2

    The linear terms are `Roofline`'s before its max(). The squares are what the A100's
    measured runs show (`a100-llama13b`): a step grows faster than its batch (a request adds
    more to a step of 34 to 68 requests than to one of 23 to 34) and faster than its context
    (fitted linearly, one pool's runs time the larger pool's steps too fast; the figures are
    in `minivtc/bench/README.md`). This machine's fit (`minivtc calibrate`) keeps d = e = 0."""

    name: str
    overhead_s: float  # per step: Python, scheduling, sampling, the weights read once
    per_prefill_token_s: float  # a: a prompt token's matmuls
    per_request_s: float  # b: each request's one new token (decode)
    per_context_token_s: float  # c: attention reading the K/V the batch holds
    # d: a request costs more the larger its batch (likely: the decode matmuls leaving the
    # memory-bound regime as their rows grow, the server's per-request work over the batch)
    per_request_squared_s: float = 0.0
    # e: attention costs more than the K/V it reads (likely: tokens scattered over a larger
    # pool, attention tiles padded to the batch's longest request)
    per_context_token_squared_s: float = 0.0
    machine: str = ""

    def step_time(self, step: StepShape) -> float:
        return (
            self.overhead_s
            + self.per_prefill_token_s * step.prefill_tokens
            + self.per_request_s * step.num_requests
            + self.per_context_token_s * step.context_tokens
            + self.per_request_squared_s * step.num_requests**2
            + self.per_context_token_squared_s * step.context_tokens**2
        )

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> MeasuredStepTime:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"no measured step-time model at {path}: run `minivtc calibrate` first"
            )
        return cls(**json.loads(path.read_text()))


# Swapping a token's keys and values to host memory and back (preemption="swap"): Llama-2-7B in
# fp16 holds 2 (K, V) x 32 layers x 4096 x 2 bytes = 0.5 MiB per token, over PCIe 4.0 x16 at
# about 25 GB/s (the A10G's link): 21 us per token each way.
SWAP_S_PER_TOKEN = 2 * 32 * 4096 * 2 / 25e9


@dataclass(frozen=True)
class StepShape:
    """What a cost model needs to know about one engine step (counts; averages over steps
    when a fit reads them off client records, `calibrate.fit_runs`)."""

    prefill_tokens: float  # tokens computed for newly admitted requests (past any cached prefix)
    num_requests: float  # requests in the batch (each gets one token)
    context_tokens: float  # K/V tokens attention reads, summed over the batch

    @classmethod
    def of(cls, requests: list[Request]) -> StepShape:
        """The shape of the step that runs `requests` (newly admitted ones prefill)."""
        prefill = context = 0
        for r in requests:  # one pass: this runs every simulated step
            n = len(r.prompt_ids) + len(r.output_ids)  # PERF: len(), see Engine.append
            context += n
            if r.num_computed < len(r.prompt_ids):  # newly admitted: computes all it lacks
                prefill += n - r.num_computed  # (a prefix cache may hold the first blocks)
        return cls(prefill, len(requests), context)


@dataclass(frozen=True)
class Roofline:
    """time = overhead + max(FLOPs / flop_rate, bytes / bandwidth) for one step."""

    name: str
    num_params: float  # model parameters
    weight_bytes: float
    kv_bytes_per_token: float
    bandwidth: float  # achievable bytes/s
    flop_rate: float  # achievable FLOP/s
    overhead_s: float  # fixed cost of a step: launches, scheduling, sampling, Python
    note: str = ""

    def step_time(self, step: StepShape) -> float:
        tokens = step.prefill_tokens + step.num_requests  # prompts, plus one token per request
        compute = 2 * self.num_params * tokens / self.flop_rate
        memory = (
            self.weight_bytes + self.kv_bytes_per_token * step.context_tokens
        ) / self.bandwidth
        return self.overhead_s + max(compute, memory)


FP16_BYTES = 2


def llama_roofline(name, n_params, n_layers, dim, bandwidth, flops, overhead, note=""):
    """A Llama's roofline in fp16 (2 bytes a weight, a key and a value per layer per token)."""
    return Roofline(
        name,
        n_params,
        n_params * FP16_BYTES,
        2 * n_layers * dim * FP16_BYTES,
        bandwidth,
        flops,
        overhead,
        note,
    )


class StepTimeModel(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def overhead_s(self) -> float: ...

    def step_time(self, step: StepShape) -> float: ...


# Datasheet bandwidth and dense fp16/bf16 rate, times achievable fractions (0.8 of bandwidth,
# 0.6 of peak FLOPs: what well-tuned kernels reach), plus 5 ms of per-step host overhead;
# the rooflines other than the A10G's are first-principles estimates, not calibrated.
STEP_TIME_MODELS: dict[str, StepTimeModel] = {
    m.name: m
    for m in [
        # A10G: 600 GB/s, 125 TFLOP/s fp16. The fractions (0.72, 0.5) and the 2 ms per step were
        # chosen so the artifact's measured VTC/FCFS runs on the real trace and the 256/256
        # overload are reproduced (`minivtc reproduce --only validate` prints the comparison).
        llama_roofline(
            "a10g-llama7b",
            6.74e9,
            32,
            4096,
            600e9 * 0.72,
            125e12 * 0.5,
            0.002,
            "calibrated on the artifact's A10G runs (data/a10g_runs)",
        ),
        MeasuredStepTime.load(A100_FIT),  # "a100-llama13b", fitted to the measured ablation
        llama_roofline(
            "a100-llama13b-roofline", 13.0e9, 40, 5120, 2.0e12 * 0.8, 312e12 * 0.6, 0.005
        ),
        llama_roofline("h100-llama7b", 6.74e9, 32, 4096, 3.35e12 * 0.8, 990e12 * 0.6, 0.005),
        llama_roofline("h200-llama7b", 6.74e9, 32, 4096, 4.8e12 * 0.8, 990e12 * 0.6, 0.005),
    ]
}


def step_time_model(name: str) -> StepTimeModel:
    """A preset by name; "measured" (this machine, from `minivtc calibrate`); or a JSON path."""
    if name in STEP_TIME_MODELS:
        return STEP_TIME_MODELS[name]
    if name == "measured":
        return MeasuredStepTime.load(DEFAULT_PATH)
    if name.endswith(".json"):
        return MeasuredStepTime.load(name)
    raise ValueError(
        f"unknown step-time model {name!r}: choose one of {', '.join(STEP_TIME_MODELS)}, "
        "'measured', "
        "or a .json file written by `minivtc calibrate`"
    )
