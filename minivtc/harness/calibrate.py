"""`minivtc calibrate`: a step-time model measured on this machine, from the real engine.

Owns `measure_steps` (time every step of the real engine on the bundled model over a grid of
batch sizes and prompt lengths), `fit` (least squares, coefficients kept >= 0, into
`step_time.MeasuredStepTime`: a step takes overhead + a * prefill tokens + b * requests + c *
context tokens, the linear form of `Roofline` before its max()), and `check` (one held-out
workload run for real and in simulation with the fitted model, side by side). The result is a
JSON file; `simulate --step-time measured` (or a path to the file) uses it, so a simulation of
the tiny model can be compared with a real run of it. Does not own the simulator (`sim.py`).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from minivtc.harness.sim import progress_bar
from minivtc.harness.step_time import DEFAULT_PATH, MeasuredStepTime, StepShape


class TimedRunner:
    """Wraps the real runner: records (step shape, seconds) for every step."""

    def __init__(self, runner) -> None:
        self.runner, self.samples = runner, []

    def run(self, requests, allocator):
        shape = StepShape.of(requests)
        start = time.perf_counter()
        tokens = self.runner.run(requests, allocator)
        self.samples.append((shape, time.perf_counter() - start))
        return tokens

    def release(self, request) -> None:
        self.runner.release(request)


@torch.inference_mode()
def measure_steps(
    model, tokenizer, quick: bool = False, progress: bool = True
) -> list[tuple[StepShape, float]]:
    """Every step's shape and time over a grid of batch sizes and prompt lengths."""
    from minivtc.core.sampler import SamplingParams
    from minivtc.llm import build_engine

    batches, prompts = ((1, 8), (16,)) if quick else ((1, 4, 16, 48), (16, 128, 512))
    grid = [(batch, n_prompt) for batch in batches for n_prompt in prompts]
    new_tokens = 8 if quick else 24
    samples = []
    with progress_bar(len(grid), "timing steps", "grid point", progress) as bar:
        for batch, n_prompt in grid:
            bar.set_postfix_str(f"batch {batch}, prompt {n_prompt}")
            engine = build_engine(model, tokenizer, "fcfs", kv_tokens=batch * (n_prompt + 64))
            engine.runner = TimedRunner(engine.runner)
            params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
            for i in range(batch):
                engine.add_request([1] + [100 + i] * (n_prompt - 1), params)
            while engine.has_unfinished():
                engine.step()
            samples += engine.runner.samples
            bar.update()
    return samples


def fit(samples: list[tuple[StepShape, float]], name: str = "measured") -> MeasuredStepTime:
    """Least squares for (overhead, per prefill token, per request, per context token) >= 0.

    Errors are relative (each row divided by its time): steps range from a millisecond (one
    decode) to a second (a batch of long prompts), and absolute errors would fit only the
    long prefills."""
    x = torch.tensor(
        [[1.0, s.prefill_tokens, s.num_requests, s.context_tokens] for s, _ in samples],
        dtype=torch.float64,
    )
    y = torch.tensor([t for _, t in samples], dtype=torch.float64)
    x, y = x / y[:, None], torch.ones_like(y)  # (pred - t) / t = x/t @ coef - 1
    keep = list(range(4))
    while True:  # drop any coefficient that comes out negative and refit (non-negative LS)
        coef = torch.linalg.lstsq(x[:, keep], y[:, None]).solution[:, 0]
        if (coef >= 0).all():
            break
        keep.pop(int(coef.argmin()))
    full = [0.0] * 4
    for i, c in zip(keep, coef.tolist(), strict=True):
        full[i] = c
    machine = f"{torch.get_num_threads()} threads, torch {torch.__version__}"
    return MeasuredStepTime(name, *full, machine=machine)


def check(model, tokenizer, cost: MeasuredStepTime, seed: int = 1) -> tuple[float, float]:
    """A held-out workload (24 requests, mixed lengths, all at t = 0), real vs simulated s."""
    from minivtc.core.sampler import SamplingParams
    from minivtc.harness.sim import simulate
    from minivtc.harness.workloads import TraceRequest
    from minivtc.llm import build_engine

    rng = random.Random(seed)
    trace = [
        TraceRequest(f"c{i % 3}", 0.0, rng.randint(8, 200), rng.randint(8, 64)) for i in range(24)
    ]
    kv_tokens = 4096
    engine = build_engine(model, tokenizer, "fcfs", kv_tokens=kv_tokens)
    start = time.perf_counter()
    with torch.inference_mode():
        for t in trace:
            params = SamplingParams(temperature=0, max_tokens=t.output_tokens, ignore_eos=True)
            engine.add_request([1] * t.input_tokens, params, client_id=t.client)
        while engine.has_unfinished():
            engine.step()
    real = time.perf_counter() - start
    sim = simulate(trace, "fcfs", cost, kv_tokens=kv_tokens, block_size=16, reservation="full")
    return real, sim.total_time


def main(out: str | Path = DEFAULT_PATH, quick: bool = False) -> MeasuredStepTime:
    from minivtc.core.weights import load_model

    model, tokenizer = load_model()
    samples = measure_steps(model, tokenizer, quick)
    cost = fit(samples)
    errors = [abs(cost.step_time(s) - t) / t for s, t in samples]
    mean_error = 100 * sum(errors) / len(errors)
    print(f"fitted on {len(samples)} steps (mean abs error {mean_error:.0f}%):")
    print(f"  overhead            {1e3 * cost.overhead_s:8.3f} ms per step")
    print(f"  per prefill token   {1e6 * cost.per_prefill_token_s:8.2f} us")
    print(f"  per request         {1e6 * cost.per_request_s:8.2f} us")
    print(f"  per context token   {1e6 * cost.per_context_token_s:8.3f} us")
    real, simulated = check(model, tokenizer, cost)
    print(
        f"held-out workload (24 requests): real {real:.2f} s, simulated {simulated:.2f} s "
        f"({100 * (simulated / real - 1):+.0f}%)"
    )
    print(f"wrote {cost.save(out)}; use it with `minivtc simulate --step-time measured`")
    return cost
