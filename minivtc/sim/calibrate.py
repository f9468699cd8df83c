"""Step-time models fitted to measurements: this machine's (`minivtc calibrate`, from the real
engine) and the A100's of the paper's ablation (`fit_runs`, from the artifact's measured runs).

Owns `measure_steps` (time every step of the real engine on the bundled model over a grid of
batch sizes and prompt lengths), `fit` (least squares, coefficients kept >= 0, into
`step_time.MeasuredStepTime`: for this machine a step takes overhead + a * prefill tokens +
b * requests + c * context tokens, the linear form of `Roofline` before its max()), and
`check` (one held-out workload run for real and in simulation with the fitted model, side by
side). The result is a JSON file; `simulate --step-time measured` (or a path to the file) uses
it, so a simulation of the tiny model can be compared with a real run of it. Does not own the
simulator (`simulator.py`).

`fit_runs` fits the same form plus its two squares (d * requests^2 + e * context tokens^2,
`MeasuredStepTime` says why) to runs measured elsewhere, from nothing but the client's records
(arrival, first token, last token, lengths): between its first and last token a request lives
through output_tokens - 1 steps, so (last - first) / (output_tokens - 1) is the mean step time
it saw, and the records say what those steps held on average (requests, K/V tokens, prompts
prefilled meanwhile). One such sample per request, least squares as `fit`. `refit_a100()`
reruns it on `data/a100_runs` (two pool sizes) into `data/a100_step_time.json`, the
`a100-llama13b` preset (`step_time.py`).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from minivtc.engine.kv_pool import BlockAllocator
from minivtc.engine.runner import Runner
from minivtc.requests.request import Request
from minivtc.sim.metrics import Served, read_requests
from minivtc.sim.simulator import progress_bar
from minivtc.sim.step_time import (
    A100_FIT,
    A100_RUNS,
    DEFAULT_PATH,
    MeasuredStepTime,
    StepShape,
)

__all__ = ["MeasuredStepTime", "fit", "fit_coefficients", "fit_error", "fit_runs", "main"]
__all__ += ["measure_steps", "terms"]

A100_MACHINE = "A100-80G, Llama-2-13B fp16, the artifact's server: fitted to data/a100_runs"


class TimedRunner:
    """Wraps the real runner: records (step shape, seconds) for every step."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.samples: list[tuple[StepShape, float]] = []

    def run(self, requests: list[Request], allocator: BlockAllocator) -> Sequence[int | Exception]:
        shape = StepShape.of(requests)
        start = time.perf_counter()
        tokens = self.runner.run(requests, allocator)
        self.samples.append((shape, time.perf_counter() - start))
        return tokens

    def release(self, request: Request) -> None:
        self.runner.release(request)

    def swap_out(self, request: Request, allocator: BlockAllocator) -> None:
        self.runner.swap_out(request, allocator)

    def swap_in(self, request: Request, allocator: BlockAllocator, start: int) -> None:
        self.runner.swap_in(request, allocator, start)


@torch.inference_mode()
def measure_steps(
    model, tokenizer, quick: bool = False, progress: bool = True
) -> list[tuple[StepShape, float]]:
    """Every step's shape and time over a grid of batch sizes and prompt lengths."""
    from minivtc.engine.factory import build_engine
    from minivtc.engine.sampler import SamplingParams

    batches, prompts = ((1, 8), (16,)) if quick else ((1, 4, 16, 48), (16, 128, 512))
    grid = [(batch, n_prompt) for batch in batches for n_prompt in prompts]
    new_tokens = 8 if quick else 24
    samples: list[tuple[StepShape, float]] = []
    with progress_bar(len(grid), "timing steps", "grid point", progress) as bar:
        for batch, n_prompt in grid:
            bar.set_postfix_str(f"batch {batch}, prompt {n_prompt}")
            engine = build_engine(model, tokenizer, "fcfs", kv_tokens=batch * (n_prompt + 64))
            timed = engine.runner = TimedRunner(engine.runner)
            params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
            for i in range(batch):
                engine.add_request([1] + [100 + i] * (n_prompt - 1), params)
            while engine.has_unfinished():
                engine.step()
            samples += timed.samples
            bar.update()
    return samples


def fit(
    samples: list[tuple[StepShape, float]], name: str = "measured", squares: bool = False
) -> MeasuredStepTime:
    """Least squares for `MeasuredStepTime`'s coefficients, all >= 0: overhead, per prefill
    token, per request, per context token, and with `squares` the two squares (B^2, C^2).

    Errors are relative (each row divided by its time): steps range from a millisecond (one
    decode) to a second (a batch of long prompts), and absolute errors would fit only the
    long prefills."""
    n = 6 if squares else 4
    x = torch.tensor([terms(s)[:n] for s, _ in samples], dtype=torch.float64)
    y = torch.tensor([t for _, t in samples], dtype=torch.float64)
    x, y = x / y[:, None], torch.ones_like(y)  # (pred - t) / t = x/t @ coef - 1
    keep = list(range(n))
    while True:  # drop any coefficient that comes out negative and refit (non-negative LS)
        coef = torch.linalg.lstsq(x[:, keep], y[:, None]).solution[:, 0]
        if (coef >= 0).all():
            break
        keep.pop(int(coef.argmin()))
    full = [0.0] * 6
    for i, c in zip(keep, coef.tolist(), strict=True):
        full[i] = c
    machine = f"{torch.get_num_threads()} threads, torch {torch.__version__}"
    overhead, per_prefill, per_request, per_context, request_sq, context_sq = full
    return MeasuredStepTime(
        name, overhead, per_prefill, per_request, per_context, request_sq, context_sq, machine
    )


def terms(step: StepShape) -> tuple[float, ...]:
    """What each of `MeasuredStepTime`'s coefficients multiplies, in its fields' order."""
    b, c = step.num_requests, step.context_tokens
    return 1.0, step.prefill_tokens, b, c, b * b, c * c


def check(model, tokenizer, cost: MeasuredStepTime, seed: int = 1) -> tuple[float, float]:
    """A held-out workload (24 requests, mixed lengths, all at t = 0), real vs simulated s."""
    from minivtc.engine.factory import build_engine
    from minivtc.engine.sampler import SamplingParams
    from minivtc.sim.simulator import simulate
    from minivtc.sim.workloads import TraceRequest

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
    from minivtc.model.weights import load_model

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


def span_samples(served: list[Served], dt: float = 0.01) -> list[tuple[StepShape, float]]:
    """One sample per request: the mean step time between its first and last token, and the
    mean shape of those steps, as the client records show them. A request is in the batch over
    [first token, last token], its K/V growing linearly from its prompt to prompt + output;
    the prompts prefilled meanwhile are those whose first token falls inside its span (a
    prefill is a pass the running requests wait through). Averages are over a grid of `dt`."""
    n = int(max(r.end_s for r in served) / dt) + 2
    # difference arrays: requests, and K/V tokens as alpha * t + beta over each span
    diffs = torch.zeros(3, n + 1, dtype=torch.float64)
    for r in served:
        i, j = int(r.start_s / dt), int(r.end_s / dt)
        alpha = r.output_tokens / max(r.end_s - r.start_s, dt)
        for row, v in enumerate((1.0, alpha, r.input_tokens - alpha * r.start_s)):
            diffs[row, i] += v
            diffs[row, j] -= v
    level = diffs.cumsum(1)
    t = torch.arange(n + 1, dtype=torch.float64) * dt
    per_dt = torch.stack([level[0], level[1] * t + level[2]])  # requests, context tokens
    area = torch.cat([torch.zeros(2, 1, dtype=torch.float64), per_dt.cumsum(1)], 1)
    by_start = sorted(served, key=lambda r: r.start_s)
    starts = [r.start_s for r in by_start]
    prefilled = [0, *itertools.accumulate(r.input_tokens for r in by_start)]
    samples = []
    for r in served:
        i, j, steps = int(r.start_s / dt), int(r.end_s / dt), r.output_tokens - 1
        if j <= i or steps < 1:
            continue  # a one-token request, or too short to average over
        requests, context = ((area[:, j] - area[:, i]) / (j - i)).tolist()
        lo, hi = bisect.bisect_right(starts, r.start_s), bisect.bisect_right(starts, r.end_s)
        shape = StepShape((prefilled[hi] - prefilled[lo]) / steps, requests, context)
        samples.append((shape, (r.end_s - r.start_s) / steps))
    return samples


def fit_runs(
    runs_dir: Path = A100_RUNS, name: str = "a100-llama13b", machine: str = A100_MACHINE
) -> MeasuredStepTime:
    """The step-time model of measured runs (`runs_dir`: CSVs and index.json, as in
    data/a100_runs), squares included, fitted to every request of every run (`span_samples`)."""
    return dataclasses.replace(fit(run_samples(runs_dir), name, squares=True), machine=machine)


def run_samples(runs_dir: Path) -> list[tuple[StepShape, float]]:
    index = json.loads((runs_dir / "index.json").read_text())
    return [s for run in index for s in span_samples(read_runs(runs_dir, run["run"]))]


def fit_coefficients(m: MeasuredStepTime) -> tuple[float, ...]:
    return (
        m.overhead_s,
        m.per_prefill_token_s,
        m.per_request_s,
        m.per_context_token_s,
        m.per_request_squared_s,
        m.per_context_token_squared_s,
    )


def fit_error(model: MeasuredStepTime, runs_dir: Path = A100_RUNS) -> tuple[float, float]:
    """Mean and worst relative error of `model` on the runs' per-request mean step times."""
    errors = [abs(model.step_time(shape) - t) / t for shape, t in run_samples(runs_dir)]
    return sum(errors) / len(errors), max(errors)


def read_runs(runs_dir: Path, run: str) -> list[Served]:
    return read_requests(runs_dir / f"{run}.csv")


def refit_a100(out: Path = A100_FIT) -> MeasuredStepTime:
    """Refit `a100-llama13b` on data/a100_runs and write it to `out` (the preset's file)."""
    model = fit_runs()
    mean, worst = fit_error(model)
    print(
        f"fitted on every request of {A100_RUNS.name}: mean step-time error {mean:.1%}, "
        f"worst {worst:.1%}"
    )
    print(
        f"  overhead {1e3 * model.overhead_s:.2f} ms, per prefill token "
        f"{1e6 * model.per_prefill_token_s:.2f} us, per request {1e6 * model.per_request_s:.2f} "
        f"us, per context token {1e6 * model.per_context_token_s:.4f} us, per request squared "
        f"{1e6 * model.per_request_squared_s:.3f} us, per context token squared "
        f"{1e12 * model.per_context_token_squared_s:.3f} ps"
    )
    print(f"wrote {model.save(out)}")
    return model
