"""Benchmarks, measured on the machine that runs them, side by side with the obvious alternative.

    minivtc bench engine         # tok/s at batch 1/16/64: engine, transformers, contiguous cache
    minivtc bench peer           # minivtc beside vLLM and transformers, each in its own process
    minivtc bench checkpoint --out DIR   # random weights of a 1B-class shape, HF layout
    minivtc bench profile        # where a decode step's time goes, and this CPU's bandwidth limit
    python -m minivtc.bench gpu  # Llama-2-7B shape, random fp16 weights, compiled attention, CUDA

`engine`: the same greedy workload (B prompts of 32 tokens, G new tokens each, EOS ignored) run
three ways on the bundled model: minivtc's engine (paged pool, continuous batching),
`transformers`' `generate` on the same weights and dtype, and a static batch over a plain
contiguous KV cache (`attention.ContiguousAttention`) to show what paging costs. Throughput is
generated tokens per second of wall time for the whole run, prefill included. The three take
turns, round by round (`interleaved`: a warm-up round, then `--repeat` rounds, 5 by default),
and each ratio is taken within a round: the table gives its median and [min, max], by wall time
and by the process's CPU time (steadier on a shared machine), and the CPU seconds beside the
wall seconds. `--threads 1` is steadier still where other processes compete for the cores.

`peer` (`peer.py`): minivtc, vLLM (compiled and eager) and `transformers`, each engine in a
process of its own loaded once, taking turns round by round on the same prompts; tokens/s,
CPU time, the ratios within rounds, the greedy tokens compared; `--load` adds the time to first
token under an offered load (`peer_load.py`), `--background N` a competing CPU load.

`profile` (`profiling.py`): at batch 1, 16 and 64, on the bundled model and on a
Llama-2-7B-shaped model with random weights cut to 2 layers, each decode step's CPU time split
into matmuls, attention (the gather, the rest), the rest of the forward pass, sampling, the
runner, the detokenizer and the engine (cProfile), and how far the step is from the weight and
KV bytes it must read over this CPU's measured memory bandwidth.

`scheduler`: microseconds per VTC admission decision (pick the minimum-counter waiting client,
admit its oldest request, charge the prompt) and per token charge, with 10 to 100,000 waiting
clients, for minivtc's heap and for the artifact's linear scan over clients, in one run.

`sim`: simulated seconds per wall second of `minivtc simulate` (the a10g-llama7b step-time model)
on the real trace and on the overload workload, under VTC and FCFS. `sim --million`: a
synthetic trace of 1,000,000 short requests (64/16 tokens) from 1000 clients instead.
`--repeat N` (default 5) runs each case N times, VTC and FCFS taking turns after a warm-up
round, and reports the min and median, the median CPU time, and the VTC / FCFS ratio round by
round, by wall and by CPU time. `scheduler` likewise alternates heap and scan for `--repeat`
rounds after a warm-up round.

`route`: microseconds per decision of the fleet's dispatcher, 64 full backends and up to
100,000 waiting clients, the median of `--repeat` rounds (default 5) with its range
(`bench/policy.py`); `route --gateway`: the gateway's added latency and throughput against
direct requests, 8 stand-in backends x 64 streams (`bench/gateway_overhead.py`; `--quick`: 2 x 16).

`gateways` (`bench/gateway_scale.py`, its own options: `minivtc bench gateways --help`): k
`minivtc route --store` gateways sharing a Redis store in front of stand-in backends, S streams
round-robin over them: streams and tokens per second per k, the ratio to k = 1, store round
trips and commands per request, and each process's CPU seconds beside the machine's cores.

`serve` (`bench/serve_http.py`, its own options: `minivtc bench serve --help`): `minivtc serve`
beside vLLM's OpenAI server (`--vllm-python`), both measured by guidellm at 1, 16 and 64
streams, taking turns: output tokens/s, TTFT p50 and p99, failures, minivtc / vLLM; and one
stream through minivtc's server over its engine's offline batch-1 rate.

`gpu`: builds a model of the chosen preset's shape with random weights directly on the device,
runs the engine with compiled attention at batch 1, 16 and 64, and reports tokens/s and the
fraction of the memory-bandwidth roofline: a decode step must read every weight once plus every
running request's keys and values, so (weight bytes + KV bytes) / step time / measured copy
bandwidth is how close the step is to the fastest possible, and how long the first round took
(the same run, compiling every bucketed shape). Then it runs the GPU-marked tests. On a machine
that shows no GPU driver it says so and exits 1 at once, before importing torch.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from minivtc.bench.peer import add_arguments as add_peer_arguments
from minivtc.bench.timing import interleaved, load_line, ratios, spread
from minivtc.requests.params import SamplingParams

__all__ = ["gpu_driver_seen", "main"]

if TYPE_CHECKING:
    import torch

    from minivtc.model.llama import Llama

# torch is imported inside the benchmarks that use it, not here: importing it takes seconds, and
# `bench gpu` on a machine without a GPU should say so at once (`gpu_driver_seen`).

PROMPT_LEN = 32


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["gateways"]:  # options of its own (`gateway_scale.py`)
        from minivtc.bench.gateway_scale import main as bench_gateways

        return bench_gateways(argv[1:])
    if argv[:1] == ["serve"]:  # options of its own (`serve_http.py`)
        from minivtc.bench.serve_http import main as bench_serve

        return bench_serve(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m minivtc.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "what",
        choices=["engine", "peer", "checkpoint", "scheduler", "sim", "route", "gpu", "profile"],
        help="what to measure; `gateways` and `serve` take options of their own (serve --help)",
    )
    parser.add_argument("--out", default=None, help="checkpoint: the directory to write")
    parser.add_argument("--quick", action="store_true", help="few tokens: a smoke run")
    parser.add_argument(
        "--preset",
        default="llama-2-7b",
        help="gpu: model shape (default llama-2-7b); checkpoint: (default bench-1b)",
    )
    parser.add_argument("--device", default="cuda", help="gpu: device (default cuda)")
    parser.add_argument("--no-tests", action="store_true", help="gpu: skip the GPU-marked tests")
    parser.add_argument("--million", action="store_true", help="sim: a 1M-request trace")
    parser.add_argument(
        "--gateway", action="store_true", help="route: the gateway's overhead instead"
    )
    parser.add_argument(
        "--chunk-rate",
        type=float,
        default=20.0,
        help="route --gateway: each stand-in stream's chunks per second, as a model decodes "
        "(default 20); 0: all at once, the gateway's capacity",
    )
    parser.add_argument(
        "--streams",
        type=int,
        default=None,
        help="route --gateway: N streams at once over two slow backends instead (a class's "
        "load): every stream served?, /health's worst, a light tenant's first token",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="engine, scheduler, sim, route: measured rounds, contenders interleaved "
        "(default 5; route --gateway 2), after a discarded warm-up round (not sim --million)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="engine, profile: torch's intra-op threads (default: torch's, one per core). On a "
        "machine shared with other busy processes, 1 thread is steadier: a parallel kernel waits "
        "for its slowest thread, and a descheduled thread stalls it",
    )
    add_peer_arguments(parser)
    args = parser.parse_args(argv)
    if args.repeat is not None and args.repeat < 1:
        parser.error("--repeat: at least 1")
    if args.chunk_rate < 0:
        parser.error("--chunk-rate: at least 0")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads: at least 1")
    if args.what == "gpu":
        if args.device.startswith("cuda") and not gpu_driver_seen():  # before torch's import
            print("no GPU here (no NVIDIA or ROCm driver): `bench gpu` needs one", file=sys.stderr)
            return 1
        from minivtc.bench.gpu import bench_gpu  # torch then confirms the device works

        return bench_gpu(args)
    if args.what == "route":  # the fleet: plain Python, no torch
        from minivtc.bench.gateway_overhead import bench_class_load, bench_gateway
        from minivtc.bench.policy import bench_route

        if args.streams is not None:
            return bench_class_load(args.streams)
        return (
            bench_gateway(args.quick, args.chunk_rate, args.repeat or 2)
            if args.gateway
            else bench_route(args.quick, args.repeat or 5)
        )
    if args.what == "checkpoint":
        if args.out is None:
            parser.error("checkpoint: --out DIR, where to write it")
        from minivtc.bench.checkpoint import write_checkpoint

        write_checkpoint(args.preset if args.preset != "llama-2-7b" else "bench-1b", args.out)
        return 0
    if args.what == "peer":  # each engine in a process of its own (`peer.py`)
        from minivtc.bench.peer import bench_peer

        return bench_peer(args)
    import torch

    torch.set_grad_enabled(False)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.what == "engine":
        return bench_engine(args.quick, args.repeat or 5)
    if args.what in ("scheduler", "sim"):  # the policy layer's (`policy.py`)
        from minivtc.bench.policy import bench_scheduler, bench_sim

        if args.what == "scheduler":
            return bench_scheduler(args.quick, args.repeat or 5)
        return bench_sim(args.quick, args.million, args.repeat or 5)
    from minivtc.bench.profiling import bench_profile

    return bench_profile(args.quick)


def gpu_driver_seen() -> bool:
    """Whether this machine shows a GPU driver, asked of the file system in a millisecond
    (importing torch to ask `torch.cuda.is_available()` takes seconds). A driver seen here may
    still fail to give a device: `bench_gpu` then asks torch."""
    marks = ["/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd"]  # NVIDIA; ROCm's torch is "cuda"
    return any(os.path.exists(m) for m in marks) or shutil.which("nvidia-smi") is not None


# --- engine vs transformers vs contiguous cache ----------------------------------------------


def bench_engine(quick: bool, rounds: int) -> int:
    import torch

    from minivtc.model.weights import bundled_weights_dir, load_model

    model, _ = load_model()
    batches, new_tokens = ([1, 4], 8) if quick else ([1, 16, 64], 128)
    hf = load_transformers(bundled_weights_dir())
    print(
        f"bundled model, fp32, {torch.get_num_threads()} threads, prompt {PROMPT_LEN} tokens, "
        f"{new_tokens} new tokens per request, greedy; {rounds} interleaved rounds after a "
        f"warm-up; generated tokens/s (wall, prefill incl.), medians [min, max] over rounds"
    )
    print(f"before: {load_line()}")
    print(
        f"{'batch':>5} {'minivtc':>8} {'transformers':>12} {'contiguous':>10} "
        f"{'vs transformers':>21} {'(CPU time)':>21} {'paging cost':>20}"
    )
    cpu_lines = []
    for b in batches:
        prompts = torch.randint(
            3, model.config.vocab_size, (b, PROMPT_LEN), generator=torch.Generator().manual_seed(b)
        )
        runs: dict[str, Callable[[], object]] = {
            "minivtc": functools.partial(run_engine, model, prompts, new_tokens),
            "contiguous": functools.partial(run_contiguous, model, prompts, new_tokens),
        }
        if hf is not None:
            runs["transformers"] = functools.partial(run_transformers, hf, prompts, new_tokens)
        times = interleaved(runs, rounds)
        print(engine_row(b, b * new_tokens, times))
        cpu_lines.append(f"{b:>5} " + " ".join(f"{median_wall_cpu(t):>14}" for t in times.values()))
    print(f"after: {load_line()}")
    print("wall s / process CPU s per run (medians):")
    print(f"{'batch':>5} " + " ".join(f"{name:>14}" for name in times))
    print("\n".join(cpu_lines))
    if hf is None:
        print("(transformers is not installed: pip install -e '.[dev]' for that column)")
    return 0


def engine_row(batch: int, num_tokens: int, times: dict[str, list[tuple[float, float]]]) -> str:
    tps = {name: num_tokens / statistics.median(w for w, _ in t) for name, t in times.items()}
    # paging cost: how much slower the paged engine ran than the contiguous cache, per round
    paging = [1 - r for r in ratios(times["contiguous"], times["minivtc"])]
    hf = times.get("transformers")
    vs_hf = spread(ratios(hf, times["minivtc"])) if hf else "-"
    vs_hf_cpu = spread(ratios(hf, times["minivtc"], clock=1)) if hf else "-"
    return (
        f"{batch:>5} {tps['minivtc']:>8.0f} {tps.get('transformers', float('nan')):>12.0f} "
        f"{tps['contiguous']:>10.0f} {vs_hf:>21} {vs_hf_cpu:>21} {spread(paging, '{:+.0%}'):>20}"
    )


def median_wall_cpu(times: list[tuple[float, float]]) -> str:
    wall, cpu = (statistics.median(column) for column in zip(*times, strict=True))
    return f"{wall:.2f} / {cpu:.2f}"


def run_engine(model: Llama, prompts: torch.Tensor, new_tokens: int) -> None:
    from minivtc.engine.factory import build_engine

    b = prompts.shape[0]
    engine = build_engine(model, None, kv_tokens=b * (PROMPT_LEN + new_tokens), max_running=b)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    for p in prompts.tolist():
        engine.add_request(p, params)
    while engine.has_unfinished():
        engine.step()


def run_contiguous(model: Llama, prompts: torch.Tensor, new_tokens: int) -> None:
    """A static batch over a contiguous cache: every row at the same position, no block tables."""
    import torch

    from minivtc.engine.sampler import sample
    from minivtc.model.attention import ContiguousAttention

    c = model.config
    b, p = prompts.shape
    cache = ContiguousAttention(
        c.n_layers,
        b,
        p + new_tokens,
        c.n_kv_heads,
        c.head_dim,
        model.embed_tokens.weight.dtype,
        prompts.device,
    )
    tokens, positions = prompts.flatten(), torch.arange(p).repeat(b)
    last_rows = torch.arange(b) * p + p - 1
    greedy = [SamplingParams(temperature=0)] * b
    for step in range(new_tokens):
        cache.set_step(torch.arange(b).repeat_interleave(len(tokens) // b), positions)
        logits = model(tokens, positions, cache, last_rows)
        tokens = torch.tensor(sample(logits, greedy, [None] * b))
        positions = torch.full((b,), p + step)
        last_rows = torch.arange(b)


def load_transformers(path):
    import torch

    try:
        import transformers
    except ImportError:
        return None
    return transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def run_transformers(hf, prompts: torch.Tensor, new_tokens: int) -> None:
    import torch

    hf.generate(
        prompts,
        attention_mask=torch.ones_like(prompts),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )


if __name__ == "__main__":
    sys.exit(main())
