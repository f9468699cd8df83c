"""Where a decode step's time goes (`minivtc bench profile`), and how far it is from this CPU's
limit.

For the bundled model and for a Llama-2-7B-shaped model with random weights cut to 2 layers, at
batch 1, 16 and 64: a batch of requests is prefilled, a few decode steps warm up, then decode
steps are timed (no profiler) and then run under `cProfile`. Each step's time is split by the
functions it spent it in (cumulative times, so nothing is counted twice):

- matmuls: `nn.Linear.forward` (the projections, the MLP, the LM head);
- attention gather: `attend_group`'s `index_select` of each request's blocks;
- attention rest: the rest of `PagedAttention` (writing new keys and values, the mask, SDPA);
- forward rest: the rest of `Llama.forward` (embedding, norms, rotary, residual adds, SiLU);
- sampling: `ModelRunner.sample` (penalties, argmax, logprobs);
- runner: the rest of `ModelRunner.run` (building the step's tensors from Python lists);
- detokenizer: `Texts.add` (the 7B shape's random tokens have no tokenizer: none);
- engine: the rest of `Engine.step` (scheduling, growing block tables, stop rules, charging).

The profiler's clock is the process's CPU time, not the wall clock: on a machine shared with
other busy processes a function's wall time includes the spells its thread waited for a core,
which fall on whichever function was running. cProfile adds a little to every Python call, so
the profiled step is slower than the timed one; the table gives both, and the shares are of the
profiled step.

The limit: a decode step must read every weight once and every running request's keys and
values, so (weight bytes + KV bytes) / memory bandwidth is the fastest a step can be. The
bandwidth is measured here by a large copy (bytes read + written per second, as `bench gpu`
states it for a GPU), per second of CPU time per thread and the best of ten copies, for the same
reason as the profiler's clock. "x limit" is the timed step's CPU time per thread (the wall time
it would take if no thread waited for a core) over that bound.
"""

from __future__ import annotations

import cProfile
import dataclasses
import inspect
import pstats
import time
from collections.abc import Callable

import torch
from torch import nn

from minivtc.bench.gpu import random_model
from minivtc.engine.engine import Engine
from minivtc.engine.factory import build_engine
from minivtc.engine.runner import ModelRunner
from minivtc.engine.text import Texts
from minivtc.model.attention import PagedAttention, attend_group
from minivtc.model.config import preset
from minivtc.model.llama import Llama
from minivtc.model.tokenizer import Tokenizer
from minivtc.model.weights import load_model
from minivtc.requests.params import SamplingParams

__all__ = ["bench_profile"]

COLUMNS = [
    "matmuls",
    "attn gather",
    "attn rest",
    "fwd rest",
    "sampling",
    "runner",
    "detok",
    "engine",
]


@dataclasses.dataclass
class Case:
    name: str
    model: Llama
    tokenizer: Tokenizer | None
    prompt_len: int
    steps: int  # decode steps timed, and as many profiled


def bench_profile(quick: bool) -> int:
    bandwidth = cpu_copy_bandwidth()
    batches = [1, 4] if quick else [1, 16, 64]
    print(
        f"decode steps, fp32, {torch.get_num_threads()} threads, profiler: cProfile; memory "
        f"copy bandwidth {bandwidth / 1e9:.1f} GB/s (read + written)"
    )
    header = " ".join(f"{c:>11}" for c in COLUMNS)
    print(
        f"{'model':>8} {'batch':>5} {'wall ms':>8} {'CPU ms':>7} {'profiled':>8} {header} "
        f"{'limit ms':>8} {'x limit':>7}"
    )
    for case in cases(quick):
        for batch in batches:
            print(profile_row(case, batch, bandwidth))
    print("(shares of the profiled step; the timed step is without the profiler)")
    return 0


def cases(quick: bool) -> list[Case]:
    model, tokenizer = load_model()
    shape = "tiny" if quick else "llama-2-7b"  # quick: a smoke run of the same code
    config = dataclasses.replace(preset(shape), n_layers=2)
    big = random_model(config, torch.float32, torch.device("cpu"))
    # A short prompt for the 7B shape: its batch-64 prefill costs minutes on a laptop CPU, and
    # the decode steps measured here barely depend on it.
    return [
        Case("bundled", model, tokenizer, 32, 2 if quick else 32),
        Case(f"{shape[:5]}-2L", big, None, 8, 1 if quick else 4),
    ]


def profile_row(case: Case, batch: int, bandwidth: float) -> str:
    engine = decoding_engine(case, batch)
    context = engine.running[0].num_tokens  # every request has as many tokens
    wall, cpu = time.perf_counter(), time.process_time()
    run_steps(engine, case.steps)
    wall, cpu = (time.perf_counter() - wall) / case.steps, (time.process_time() - cpu) / case.steps
    profiler = cProfile.Profile(time.process_time)
    profiler.runcall(run_steps, engine, case.steps)
    shares = split(pstats.Stats(profiler))
    total = shares.pop("step")
    limit_s = step_bytes(case.model, batch, context + case.steps) / bandwidth
    cells = " ".join(f"{shares[c] / total:>11.0%}" for c in COLUMNS)
    per_thread = cpu / torch.get_num_threads()
    return (
        f"{case.name:>8} {batch:>5} {1000 * wall:>8.1f} {1000 * cpu:>7.1f} "
        f"{1000 * total / case.steps:>8.1f} {cells} {1000 * limit_s:>8.2f} "
        f"{per_thread / limit_s:>6.1f}x"
    )


def decoding_engine(case: Case, batch: int) -> Engine:
    """An engine with `batch` requests prefilled and two decode steps done (warm)."""
    room = case.prompt_len + 2 * case.steps + 3
    kv_tokens = batch * (room + 16)  # room for each request's last, partly filled block
    engine = build_engine(case.model, case.tokenizer, kv_tokens=kv_tokens, max_running=batch)
    params = SamplingParams(temperature=0, max_tokens=room - case.prompt_len, ignore_eos=True)
    for i in range(batch):
        engine.add_request([3 + (7 * i + j) % 1000 for j in range(case.prompt_len)], params)
    run_steps(engine, 3)  # the prefill, then two decode steps
    assert len(engine.running) == batch, "every request decodes in one batch"
    return engine


def run_steps(engine: Engine, n: int) -> None:
    for _ in range(n):
        engine.step()


def split(stats: pstats.Stats) -> dict[str, float]:
    """Seconds in each of COLUMNS (and the whole "step"), from cumulative times."""
    times = stats.stats  # type: ignore[attr-defined]  # (file, line, name) -> (.., tt, ct, callers)

    def cum(fn: Callable) -> float:
        return sum(v[3] for k, v in times.items() if k == key(fn))

    def builtin_from(name: str, caller: Callable) -> float:
        return sum(
            v[4].get(key(caller), (0, 0, 0, 0))[3]
            for k, v in times.items()
            if k[0] == "~" and f"'{name}'" in k[2]
        )

    step, run, forward = cum(Engine.step), cum(ModelRunner.run), cum(Llama.forward)
    attention, matmuls = cum(PagedAttention.__call__), cum(nn.Linear.forward)
    gather = builtin_from("index_select", attend_group)
    sampling, detok = cum(ModelRunner.sample), cum(Texts.add)
    return {
        "step": step,
        "matmuls": matmuls,
        "attn gather": gather,
        "attn rest": attention - gather,
        "fwd rest": forward - matmuls - attention,
        "sampling": sampling,
        "runner": run - forward - sampling,
        "detok": detok,
        "engine": step - run - detok,
    }


def key(fn: Callable) -> tuple[str, int, str]:
    code = inspect.unwrap(fn).__code__
    return code.co_filename, code.co_firstlineno, code.co_name


def cpu_copy_bandwidth() -> float:
    """Bytes read + written per CPU second per thread by a 256 MB copy, the best of ten."""
    src = torch.randn(1 << 26)  # well past any cache
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(10):
        start = time.process_time()
        dst.copy_(src)
        best = min(best, time.process_time() - start)
    return 2 * src.numel() * src.element_size() / (best / torch.get_num_threads())


def step_bytes(model: Llama, batch: int, context: float) -> float:
    """Bytes a decode step must read: every weight once (the embedding only for the batch's
    rows), and every request's keys and values over its context."""
    c = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.embed_tokens.weight
    weights -= (c.vocab_size - min(batch, c.vocab_size)) * c.dim * embedding.element_size()
    return weights + batch * context * c.kv_bytes_per_token(embedding.element_size())
