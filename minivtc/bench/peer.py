"""`minivtc bench peer`: minivtc beside vLLM and `transformers`, each engine in a process of
its own, on the same prompts with the same sampling, taking turns.

    minivtc bench peer --dtype bf16                    # the bundled model, batch 1, 16 and 64
    minivtc bench peer --weights big-model --batches 1,16 --rounds 3
    minivtc bench peer --background 2                  # the same with a competing CPU load

Each contender is a `peer_worker` process that loads its engine once and then runs each batch
it is sent: minivtc's engine (`--minivtc-modes`: packed, compiled, plain; the first is the one
the others are measured against), vLLM compiled (its default) and eager, and `transformers`'
`generate`. A round sends every batch size to every contender in turn (the order rotating),
with prompts drawn afresh for the round (no prefix cache sees one twice), the same for every
contender: B prompts of 32 random token ids, 128 new tokens each, greedy, EOS ignored. The first
round warms every engine (vLLM and minivtc compiled compile there) and is discarded. Reported
per batch size: generated tokens/s over the run's wall time (prefill included), median [min,
max] over rounds; the process tree's CPU seconds beside the wall seconds (vLLM's engine core
runs in a child process); minivtc's ratio to each peer within each round, median [min, max];
and the greedy tokens compared token for token, each divergence judged by the plain path in
fp32 (`peer_worker.top_logits`): a near tie (float rounding decides it) or not (only a bug).

vLLM runs from its own virtual environment (`--vllm-python`, default `.ci-vllm-venv/bin/python`
or `$MINIVTC_VLLM_PYTHON`; it pins its own packages): without one its columns are left out and
the table says why. Every engine runs on the same allocator (`--allocator`, default "auto":
TCMalloc, vLLM's documented CPU setting, where it is installed, else oneTBB's;
`serving/allocator.py`) and the same threads.

`--load`: then the time to first token under an offered load: `minivtc serve` and vLLM's
OpenAI server on the same model, Poisson arrivals (32-token prompts, 128 new tokens) at
`--load-fraction` (default 0.5) of the slower engine's measured throughput at batch 16, 20 s per
turn, the two servers taking turns for `--rounds` turns each. `--background N` runs N busy
processes (a fixed pure-Python loop each) for the whole measurement: a student's laptop is
never idle.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from minivtc.bench.peer_worker import ANSWER, top_logits
from minivtc.bench.timing import load_line, machine_line, spread, wait_until_quiet
from minivtc.serving.allocator import ALLOCATOR_HELP, ALLOCATORS, preload_for

__all__ = ["add_arguments", "bench_peer", "engine_env", "vllm_python"]

PROMPT_LEN = 32
NEAR_TIE = 0.05  # fp32 logits this close: a tie that rounding in either engine may break


@dataclass
class Worker:
    """One contender's process: send a JSON line, read its ANSWER line."""

    name: str
    process: subprocess.Popen
    times: dict[int, list[tuple[float, float]]] = field(default_factory=dict)  # batch -> runs
    prompts: dict[int, list[list[int]]] = field(default_factory=dict)  # batch -> last round's
    tokens: dict[int, list[list[int]]] = field(default_factory=dict)  # ... and what it made
    decode_s: dict[int, list[float]] = field(default_factory=dict)  # minivtc: its decode steps

    def ask(self, message: dict) -> dict:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        return self.answer()

    def answer(self) -> dict:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(ANSWER):
                return json.loads(line[len(ANSWER) :])
        raise RuntimeError(f"{self.name}'s worker ended without answering (its log is above)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    peer = parser.add_argument_group("peer")
    peer.add_argument("--weights", default=None, help="peer: a Llama directory (default bundled)")
    peer.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="peer: dtype")
    peer.add_argument("--batches", default="1,16,64", help="peer: batch sizes (default 1,16,64)")
    peer.add_argument("--new-tokens", type=int, default=128, help="peer: tokens per request")
    peer.add_argument("--vllm-python", default=None, help="peer: vLLM's venv's python")
    vllm_modes = "peer: vLLM's modes, compiled (its default), eager, both, or none"
    peer.add_argument("--vllm-modes", default="compiled,eager", help=vllm_modes)
    peer.add_argument("--no-transformers", action="store_true", help="peer: skip transformers")
    modes = "peer: minivtc's modes, the first measured against the rest: packed, compiled, plain"
    peer.add_argument("--minivtc-modes", default="packed", help=modes)
    allocators = f"peer: {ALLOCATOR_HELP}"
    peer.add_argument("--allocator", choices=ALLOCATORS, default="auto", help=allocators)
    peer.add_argument("--load", action="store_true", help="peer: also TTFT under offered load")
    peer.add_argument("--load-fraction", type=float, default=0.5, help="peer: offered load")
    peer.add_argument("--background", type=int, default=0, help="peer: N competing busy loops")


def bench_peer(args: argparse.Namespace) -> int:
    from minivtc.model.weights import bundled_weights_dir, load_config

    weights = str(args.weights or bundled_weights_dir())
    batches = [int(b) for b in args.batches.split(",")]
    rounds = args.repeat or 5
    vocab = load_config(Path(weights)).vocab_size
    env = engine_env(args.allocator)
    if args.threads is not None:
        env["OMP_NUM_THREADS"] = str(args.threads)
    vllm = vllm_python(args.vllm_python)
    with background_load(args.background), contextlib.ExitStack() as stack:
        workers = start_workers(args, weights, max(batches), vllm, env, stack)
        print(machine_line(env))  # the CPU kind and the allocator: speeds differ by both
        print(
            f"{weights}, {args.dtype}, prompts of {PROMPT_LEN} random ids, {args.new_tokens} new "
            f"tokens each, greedy, EOS ignored; {rounds} rounds after a warm-up, contenders "
            f"taking turns; {args.background} competing busy processes; "
            f"threads {env.get('OMP_NUM_THREADS', 'default')}"
        )
        if vllm is None:
            print("vLLM: no venv found (--vllm-python, or .ci-vllm-venv): its columns are absent")
        print(f"before: {load_line()}")
        for k in range(-1, rounds):
            run_round(workers, batches, args.new_tokens, vocab, k)
            print(f"round {k + 1}/{rounds} done" if k >= 0 else "warm-up done", flush=True)
        print(f"after: {load_line()}")
        print(throughput_table(workers, batches, args.new_tokens))
        if 1 in batches:
            print(bandwidth_line(workers, weights, args))
        stack.close()  # the workers end: the judge below and the servers need their memory
        print(greedy_table(workers, batches, weights))
        if args.load:
            from minivtc.bench.peer_load import bench_load

            bench_load(args, weights, offered_rate(workers, batches, args), vllm, env, rounds)
    return 0


def offered_rate(workers: list[Worker], batches: list[int], args: argparse.Namespace) -> float:
    """Requests per second: `--load-fraction` of the slower of minivtc and vLLM's default
    (compiled) mode at batch 16 (or the largest batch below it), in tokens/s over 128-token
    requests."""
    b = max((x for x in batches if x <= 16), default=min(batches))
    engines = [workers[0]] + [w for w in workers if w.name == "vllm compiled"]
    tps = min(statistics.median(b * args.new_tokens / t for t, _ in w.times[b]) for w in engines)
    return args.load_fraction * tps / args.new_tokens


def engine_env(allocator: str) -> dict[str, str]:
    """Every engine's environment, here and in `bench serve`: `allocator`'s preload (set even
    when empty: then `minivtc serve` does not choose another), vLLM's KV space."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"))
    env["LD_PRELOAD"] = preload_for(allocator)
    return env


def vllm_python(given: str | None) -> str | None:
    for candidate in (given, os.environ.get("MINIVTC_VLLM_PYTHON"), ".ci-vllm-venv/bin/python"):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def start_workers(
    args: argparse.Namespace,
    weights: str,
    max_batch: int,
    vllm: str | None,
    env: dict[str, str],
    stack: contextlib.ExitStack,
) -> list[Worker]:
    """Every contender's process, loaded (one after another: vLLM's, which compiles its graph
    at start, is the slowest)."""
    common = [weights, "--dtype", args.dtype, "--max-batch", str(max_batch)]
    common += ["--max-len", str(PROMPT_LEN + args.new_tokens + 16)]
    if args.threads is not None:
        common += ["--threads", str(args.threads)]
    minivtc = {"packed": [], "compiled": ["--compiled"], "plain": ["--plain"]}
    asked = args.minivtc_modes.split(",")
    if unknown := set(asked) - set(minivtc):
        raise SystemExit(f"--minivtc-modes: {', '.join(unknown)}? (packed, compiled, plain)")
    plans = [
        (f"minivtc {m}".removesuffix(" packed"), sys.executable, ["minivtc", *minivtc[m]])
        for m in asked
    ]
    if vllm is not None:
        modes = [m for m in args.vllm_modes.split(",") if m in ("compiled", "eager")]
        plans += [
            (f"vllm {m}", vllm, ["vllm"] + (["--eager"] if m == "eager" else [])) for m in modes
        ]
    if not args.no_transformers:
        plans.append(("transformers", sys.executable, ["transformers"]))
    workers = []
    root = str(Path(__file__).resolve().parents[2])  # vLLM's venv finds this package here
    worker_env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")])))
    for name, python, engine in plans:
        print(f"loading {name} ...", flush=True)
        command = [python, "-m", "minivtc.bench.peer_worker", *engine, *common]
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=worker_env
        )
        stack.callback(stop, process)
        worker = Worker(name, process)
        worker.answer()  # its "ready"
        workers.append(worker)
    return workers


def stop(process: subprocess.Popen) -> None:
    with contextlib.suppress(OSError, ValueError):
        assert process.stdin is not None
        process.stdin.close()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()


def run_round(
    workers: list[Worker], batches: list[int], new_tokens: int, vocab: int, k: int
) -> None:
    rng = random.Random(1000 + k)  # this round's prompts, the same for every contender
    for b in batches:
        prompts = [[rng.randrange(3, vocab) for _ in range(PROMPT_LEN)] for _ in range(b)]
        shift = (k + 1) % len(workers)
        for w in workers[shift:] + workers[:shift]:
            wait_until_quiet([other.process.pid for other in workers if other is not w])
            got = w.ask({"prompts": prompts, "new_tokens": new_tokens})
            if k >= 0:
                w.times.setdefault(b, []).append((got["wall_s"], got["cpu_s"]))
                if "decode_s" in got:
                    w.decode_s.setdefault(b, []).append(got["decode_s"])
                w.prompts[b], w.tokens[b] = prompts, got["tokens"]


def throughput_table(workers: list[Worker], batches: list[int], new_tokens: int) -> str:
    mine, peers = workers[0], workers[1:]
    lines = ["generated tokens/s, median [min, max] over rounds; wall s / CPU s (medians)"]
    for b in batches:
        lines.append(f"batch {b}:")
        for w in workers:
            tps = [b * new_tokens / wall for wall, _ in w.times[b]]
            wall, cpu = (statistics.median(c) for c in zip(*w.times[b], strict=True))
            lines.append(
                f"  {w.name:<16} {spread(tps, '{:,.0f}'):>26}   {wall:7.2f} s / {cpu:7.2f} s CPU"
            )
        for p in peers:
            wall = [pw / mw for (pw, _), (mw, _) in zip(p.times[b], mine.times[b], strict=True)]
            cpu = [pc / mc for (_, pc), (_, mc) in zip(p.times[b], mine.times[b], strict=True)]
            lines.append(
                f"  {mine.name} / {p.name:<12} {spread(wall):>26} by wall time, "
                f"{spread(cpu)} by CPU time"
            )
    return "\n".join(lines)


def bandwidth_line(workers: list[Worker], weights: str, args: argparse.Namespace) -> str:
    """Batch 1's memory-bandwidth limit: each token must read every weight once (the embedding
    but one row), so tokens/s can be at most read bandwidth / weight bytes."""
    from minivtc.model.weights import load_config

    config = load_config(Path(weights))
    per_token = (config.num_params - (config.vocab_size - 1) * config.dim) * (
        4 if args.dtype == "fp32" else 2
    )
    bandwidth, pages = read_bandwidth()
    limit = bandwidth / per_token
    reached = ", ".join(
        f"{w.name} {statistics.median(args.new_tokens / t for t, _ in w.times[1]) / limit:.0%}"
        for w in workers
    )
    decode = ""
    if workers[0].decode_s.get(1):  # the prefill left out: what the limit is about
        rate = statistics.median((args.new_tokens - 1) / s for s in workers[0].decode_s[1])
        decode = (
            f"; {workers[0].name}'s decode steps alone {rate:,.1f} tokens/s, {rate / limit:.0%}"
        )
    return (
        f"batch 1's bandwidth limit: {per_token / 1e9:.2f} GB of weights per token over a read "
        f"bandwidth of {bandwidth / 1e9:.1f} GB/s (1 GB summed on {pages} pages, all threads) = "
        f"{limit:,.1f} tokens/s; reached (prefill included): {reached}{decode}"
    )


def read_bandwidth() -> tuple[float, str]:
    """Bytes read per wall second by summing 1 GB, the best of five: what a decode step does
    with its weights (reads them; a copy would also write, and writing is slower here), on
    2 MiB pages where the kernel can (`huge_pages.py`), and which pages ("2 MiB", "4 KiB")."""
    import torch

    from minivtc.bench.huge_pages import collapse_onto_huge_pages

    src = torch.ones(1 << 28)
    pages = "2 MiB" if collapse_onto_huge_pages([src]) > src.nbytes // 2 else "4 KiB"
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        src.sum()
        best = min(best, time.perf_counter() - start)
    return src.numel() * src.element_size() / best, pages


def greedy_table(workers: list[Worker], batches: list[int], weights: str) -> str:
    """The last round's greedy tokens, minivtc against each peer, sequence by sequence."""
    mine = workers[0]
    lines = ["greedy tokens, the last round, minivtc against each peer:"]
    for p in workers[1:]:
        for b in batches:
            same, parted = 0, []
            for prompt, a, c in zip(mine.prompts[b], mine.tokens[b], p.tokens[b], strict=True):
                if a == c:
                    same += 1
                    continue
                at = next(i for i, (x, y) in enumerate(zip(a, c, strict=False)) if x != y)
                parted.append(judge(weights, prompt + a[:at], a[at], c[at]))
            ties = sum(1 for near, _ in parted if near)
            worst = max((gap for _, gap in parted), default=0.0)
            lines.append(
                f"  {p.name:<16} batch {b:>3}: {same}/{b} identical; {len(parted)} part, "
                f"{ties} of them at an fp32 near tie (gap < {NEAR_TIE}); largest gap {worst:.4f}"
            )
    return "\n".join(lines)


def judge(weights: str, ids: list[int], a: int, c: int) -> tuple[bool, float]:
    """Where two greedy sequences part: the fp32 gap between the two tokens chosen (both must be
    among the plain path's top five), and whether that gap is a near tie."""
    top = top_logits(weights, ids)
    logits = dict(zip(top["ids"], top["logits"], strict=True))
    if a not in logits or c not in logits:
        return False, float("inf")
    gap = abs(logits[a] - logits[c])
    return gap < NEAR_TIE, gap


@contextlib.contextmanager
def background_load(n: int) -> Iterator[None]:
    """`n` processes each spinning a pure-Python loop: a fixed competing load on the cores."""
    spin = "while True:\n    sum(range(10000))"
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()
