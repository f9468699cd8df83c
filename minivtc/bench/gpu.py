"""The GPU check (`python -m minivtc.bench gpu`): the 7B shape on one GPU, compiled attention.

Builds a model of the chosen preset's shape with random weights directly on the device, runs
the engine with compiled attention at batch 1, 16 and 64, and reports tokens/s and the fraction
of the memory-bandwidth roofline: a decode step must read every weight once plus every running
request's keys and values, so (weight bytes + KV bytes) / step time / measured copy bandwidth
is how close the step is to the fastest possible. Then it runs the GPU-marked tests.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass

import torch

from minivtc.engine.factory import build_engine
from minivtc.model.config import preset
from minivtc.model.llama import Llama
from minivtc.requests.params import SamplingParams

__all__ = ["bench_gpu", "random_model"]

PROMPT_LEN = 32  # as `bench engine`


@dataclass
class GpuRow:
    batch: int
    tokens_per_s: float
    step_ms: float
    roofline: float
    first_round_s: float  # the same run before it, compiling every bucketed shape it meets


def bench_gpu(args) -> int:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: the GPU check needs one")
        return 1
    began = time.perf_counter()
    config = preset(args.preset)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    model = random_model(config, dtype, device)
    bandwidth = copy_bandwidth(device)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    print(
        f"{args.preset} shape, random weights, {dtype}, {device}: {weight_bytes / 1e9:.2f} GB "
        f"of weights; copy bandwidth {bandwidth / 1e9:.0f} GB/s"
    )
    new_tokens = 16 if args.quick else 256
    rows = [gpu_row(model, b, new_tokens, weight_bytes, bandwidth, device) for b in (1, 16, 64)]
    print(f"{'batch':>5} {'tok/s':>9} {'step ms':>8} {'roofline':>9} {'first round s':>14}")
    for r in rows:
        print(
            f"{r.batch:>5} {r.tokens_per_s:>9.0f} {r.step_ms:>8.2f} {r.roofline:>8.0%} "
            f"{r.first_round_s:>14.1f}"
        )
    took = time.perf_counter() - began
    print(f"(first round s: the same run before, compiling included; all of it: {took:.0f} s)")
    if args.no_tests:
        return 0
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests"])


def random_model(config, dtype: torch.dtype, device: torch.device) -> Llama:
    """A model of `config`'s shape with small random weights, made directly on the device in
    `dtype` (shapes on "meta" first: a 7B model never exists in fp32, so it fits an A10G)."""
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Llama(config)
    model = model.to(dtype).to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02) if p.dim() > 1 else p.fill_(1.0)  # norms start at 1
    return model.eval()


def copy_bandwidth(device: torch.device) -> float:
    """Bytes read + written per second by a large device-to-device copy."""
    n = (1 << 28) if device.type == "cuda" else (1 << 26)  # CPU: 256 MB, well past any cache
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    sync(device)
    return 10 * 2 * src.numel() * src.element_size() / (time.perf_counter() - start)


def gpu_row(model, batch, new_tokens, weight_bytes, bandwidth, device) -> GpuRow:
    c = model.config
    engine = build_engine(
        model,
        None,
        kv_tokens=batch * (PROMPT_LEN + new_tokens) + 64,
        max_running=batch,
        compile_attention=device.type == "cuda",
    )
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    first_round = time.perf_counter()
    for round in range(2):  # the first round compiles every bucketed shape
        if round == 1:
            first_round = time.perf_counter() - first_round
        for i in range(batch):
            engine.add_request([1 + (i + j) % 1000 for j in range(PROMPT_LEN)], params)
        engine.step()  # prefill
        sync(device)
        start, steps = time.perf_counter(), 0
        while engine.has_unfinished():
            engine.step()
            steps += 1
        sync(device)
    elapsed = time.perf_counter() - start
    mean_context = PROMPT_LEN + new_tokens / 2
    kv_bytes = batch * mean_context * c.kv_bytes_per_token(model.embed_tokens.weight.element_size())
    step_s = elapsed / steps
    return GpuRow(
        batch,
        batch * steps / elapsed,
        1000 * step_s,
        (weight_bytes + kv_bytes) / step_s / bandwidth,
        first_round,
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
