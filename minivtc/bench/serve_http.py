"""`minivtc bench serve`: minivtc's server beside vLLM's OpenAI server, both measured by guidellm
(the vLLM project's benchmark client, which neither server's authors wrote), and one stream
through minivtc's server beside its engine's own rate.

Both servers start once, on the same model, dtype, `--max-num-seqs` and `--max-model-len`, with
FCFS (guidellm is one client, so a fair policy would order the same), and take turns: in each
round guidellm's concurrent profile runs every stream count against one server, then against the
other (who goes first alternates by round; each turn starts once the other servers are idle),
then the engine alone decodes one request of the same shape in a process of its own (batch 1;
compiled as `minivtc serve` runs it, or eager with `--enforce-eager`). Per server and stream
count: output tokens/s, time to first token p50 and p99 over every request of every round, and
failed requests; minivtc / vLLM as the median of the rounds' ratios with their range, and one
stream's rate through HTTP over the engine's offline rate the same way. One stream runs in a
guidellm process of its own, and each server's CPU time meanwhile is read from /proc by
thread: per output token, what the engine's threads, the HTTP thread (minivtc) or the API
server (vLLM) spent, so the distance from the engine's rate can be laid at the right door (on
a machine of few cores, the client's own CPU comes out of the engine's). A first round is a
discarded warm-up. Run it on a quiet machine: anything else running shifts both servers
unevenly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from minivtc.bench.peer import engine_env, vllm_python
from minivtc.bench.peer_worker import proc_stats, process_tree
from minivtc.bench.timing import counts, load_line, machine_line, spread, wait_until_quiet
from minivtc.gateway.proxy import free_port, wait_healthy
from minivtc.serving.allocator import ALLOCATOR_HELP, ALLOCATORS
from minivtc.vllm_plugin.overload import ASYNC_FAIR_SCHEDULER

__all__ = ["main"]


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="minivtc bench serve",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument(
        "--streams", type=counts, default=[1, 16, 64], help="concurrent streams (default 1,16,64)"
    )
    p.add_argument("--prompt-tokens", type=int, default=32, help="per request (default 32)")
    p.add_argument("--new-tokens", type=int, default=64, help="per request, EOS ignored (64)")
    p.add_argument(
        "--requests",
        type=int,
        default=3,
        help="requests per stream per round (default 3; at least 16 a round)",
    )
    p.add_argument("--rounds", type=int, default=2, help="measured rounds (default 2)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--weights", default=None, help="a checkpoint folder (default: the bundled)")
    p.add_argument("--vllm-python", default=None, help="vLLM's venv's python (else no vLLM)")
    p.add_argument("--allocator", choices=ALLOCATORS, default="auto", help=ALLOCATOR_HELP)
    eager = "minivtc's server and its engine eager, not compiled (as `serve --enforce-eager`)"
    p.add_argument("--enforce-eager", action="store_true", help=eager)
    p.add_argument(
        "--plugin",
        action="store_true",
        help="also vLLM with VTC inside it (AsyncFairScheduler): what the plugin costs vLLM",
    )
    args = p.parse_args(argv)
    if args.rounds < 1 or args.requests < 1:
        p.error("--rounds and --requests: at least 1")
    return args


def main(argv: list[str]) -> int:
    if argv[:1] == ["offline"]:  # the engine alone, in a process of its own (below)
        print(json.dumps(offline_rate(*argv[1:5])))
        return 0
    args = parse(argv)
    from minivtc.model.weights import bundled_weights_dir

    weights = str(args.weights or bundled_weights_dir())
    env = engine_env(args.allocator)
    vllm = vllm_python(args.vllm_python)
    print(machine_line(env), flush=True)
    print(
        f"{weights}, {args.dtype}, /v1/completions streamed, prompts of {args.prompt_tokens} "
        f"tokens, {args.new_tokens} new tokens (EOS ignored), "
        f"streams {','.join(map(str, args.streams))}, "
        f"{args.rounds} rounds after a warm-up"
    )
    if vllm is None:
        print("vLLM: no venv found (--vllm-python, or .ci-vllm-venv): its columns are absent")
    results: dict[str, list[dict[int, dict]]] = {}
    offline: list[float] = []
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        urls, pids = start_servers(args, weights, vllm, env, stack)
        cpu: dict[str, list[dict[str, float]]] = {name: [] for name in urls}
        print(f"before: {load_line()}", flush=True)
        for k in range(-1, args.rounds):
            shift = k % len(urls)  # who goes first turns with the rounds
            names = list(urls)[shift:] + list(urls)[:shift]
            for name in names:
                out = Path(tmp) / f"{name}-{k}.json"
                # vLLM's engine keeps polling a core after its last request: not into the
                # next server's turn (`wait_until_quiet`, as `bench peer` takes turns)
                wait_until_quiet([pid for other, pid in pids.items() if other != name])
                measured = guidellm(urls[name], args, out, weights, pids[name], cpu[name])
                if k >= 0:
                    results.setdefault(name, []).append(measured)
            rate = offline_in_process(weights, args, env)
            if k >= 0:
                offline.append(rate)
            print(f"round {k + 1}/{args.rounds} done" if k >= 0 else "warm-up done", flush=True)
        print(f"after: {load_line()}")
    print(table(results, args.streams))
    if 1 in args.streams:
        ones = [r[1]["tokens_s"] / o for r, o in zip(results["minivtc"], offline, strict=True)]
        print(
            f"one stream through minivtc's server / its engine offline at batch 1 "
            f"({statistics.median(offline):.0f} tokens/s): {spread(ones, '{:.0%}')}"
        )
        print(cpu_lines(cpu))
    return 0


def start_servers(
    args, weights: str, vllm: str | None, env: dict, stack
) -> tuple[dict[str, str], dict[str, int]]:
    """Both servers, started once and left idle while the other is measured: their URLs and
    process ids."""
    max_len = str(args.prompt_tokens + args.new_tokens + 16)
    seqs = str(max(args.streams))
    ports = {"minivtc": free_port(), "vllm": free_port()}
    commands = {
        "minivtc": [sys.executable, "-m", "minivtc", "serve", "--weights", weights]
        + ["--dtype", args.dtype, "--scheduler", "fcfs", "--max-num-seqs", seqs]
        + ["--max-model-len", max_len, "--port", str(ports["minivtc"])]
        + ["--disable-log-requests"]
        + (["--enforce-eager"] if args.enforce_eager else []),
    }
    if vllm is not None:
        commands["vllm"] = [vllm, "-m", "vllm.entrypoints.openai.api_server", "--model", weights]
        commands["vllm"] += ["--dtype", {"fp32": "float32", "bf16": "bfloat16"}[args.dtype]]
        commands["vllm"] += ["--max-num-seqs", seqs, "--max-model-len", max_len]
        commands["vllm"] += ["--port", str(ports["vllm"])]
        if args.plugin:  # the same server with VTC in its waiting queue (vllm_plugin/)
            ports["vllm vtc"] = free_port()
            commands["vllm vtc"] = commands["vllm"][:-1] + [str(ports["vllm vtc"])]
            commands["vllm vtc"] += ["--scheduler-cls", ASYNC_FAIR_SCHEDULER]
            commands["vllm vtc"] += ["--additional-config", '{"minivtc": {"policy": "vtc"}}']
    urls, pids = {}, {}
    for name, command in commands.items():
        print(f"starting {name}'s server (its log: bench-serve-{name}.log) ...", flush=True)
        log = stack.enter_context(open(f"bench-serve-{name}.log", "w"))
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        stack.callback(stop, process)
        urls[name], pids[name] = f"http://127.0.0.1:{ports[name]}", process.pid
        wait_healthy(urls[name], 900, process)
    return urls, pids


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()


def guidellm(
    url: str, args, out: Path, weights: str, pid: int, cpu: list[dict[str, float]]
) -> dict[int, dict]:
    """guidellm over every stream count; per count: tokens/s, TTFTs (ms), failures. One stream
    runs alone first, and what the server's threads spent of the CPU meanwhile, per output
    token, is added to `cpu` (`server_cpu`): the server is idle but for it."""
    measured: dict[int, dict] = {}
    if 1 in args.streams:
        before = server_cpu(pid)
        one, tokens = guidellm_run(url, args, [1], out.with_suffix(".one.json"), weights)
        after = server_cpu(pid)
        cpu.append({k: (t - before.get(k, 0.0)) / max(tokens, 1) for k, t in after.items()})
        measured |= one
    if rest := [s for s in args.streams if s != 1]:
        measured |= guidellm_run(url, args, rest, out, weights)[0]
    return measured


def guidellm_run(
    url: str, args, streams: list[int], out: Path, weights: str
) -> tuple[dict[int, dict], float]:
    """One guidellm process over `streams`, and the output tokens it counted in all."""
    scenario = {
        "spec": {
            "backend": {"kind": "openai_http", "target": url, "request_format": "/v1/completions"},
            "profile": {"kind": "concurrent", "streams": streams[0]},
            "data": [
                {
                    "kind": "synthetic_text",
                    "prompt_tokens": args.prompt_tokens,
                    "output_tokens": args.new_tokens,
                }
            ],
            "tokenizer": {"kind": "hf_auto", "model": weights},
            "outputs": [{"kind": "json", "path": str(out)}],
        },
        "benchmarks": [
            {
                "profile.streams": s,
                "constraints": [{"kind": "max_requests", "count": max(16, args.requests * s)}],
            }
            for s in streams
        ],
    }
    path = out.with_suffix(".scenario.json")
    path.write_text(json.dumps(scenario))
    command = [sys.executable, "-m", "guidellm", "run", "-c", str(path), "--disable-console"]
    env = os.environ | {"HF_HUB_OFFLINE": "1"}  # the tokenizer from the folder, nothing fetched
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"guidellm failed against {url}:\n{done.stderr[-3000:]}")
    measured, tokens = {}, 0.0
    for benchmark in json.loads(out.read_text())["benchmarks"]:
        metrics = benchmark["metrics"]
        tokens += metrics["output_token_count"]["successful"]["total_sum"]
        measured[benchmark["config"]["strategy"]["streams"]] = {
            "tokens_s": metrics["output_tokens_per_second"]["total"]["mean"],
            "ttfts": [r["time_to_first_token_ms"] for r in benchmark["requests"]["successful"]],
            "failed": metrics["request_totals"]["errored"],
        }
    return measured, tokens


def server_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of the server's process and its children, by thread name (minivtc:
    the engine's threads are "python", HTTP is "minivtc-http"; vLLM: its API server's and its
    engine core's process names), from /proc."""
    spent: dict[str, float] = {}
    for process in process_tree(pid, proc_stats(Path("/proc"))):
        with contextlib.suppress(OSError):  # (ended while we looked)
            for name, _, seconds in proc_stats(Path(f"/proc/{process}/task")).values():
                spent[name] = spent.get(name, 0.0) + seconds
    return spent


def cpu_lines(cpu: dict[str, list[dict[str, float]]]) -> str:
    """Per server, CPU ms per output token of one stream by thread (median of the rounds):
    what the server itself costs the machine per token, beside what its engine does."""
    lines = ["one stream, the server's CPU per output token (ms, median of the rounds):"]
    for name, rounds in cpu.items():
        names = {k for r in rounds for k in r}
        each = {k: statistics.median(r.get(k, 0.0) for r in rounds) * 1e3 for k in names}
        shown = sorted((k for k in each if each[k] >= 0.005), key=lambda k: -each[k])
        lines.append(f"  {name}: " + ", ".join(f"{k} {each[k]:.2f}" for k in shown))
    return "\n".join(lines)


def offline_in_process(weights: str, args, env: dict) -> float:
    command = [sys.executable, "-m", "minivtc", "bench", "serve", "offline", weights]
    command += [args.dtype, f"{args.prompt_tokens},{args.new_tokens}"]
    command += ["eager" if args.enforce_eager else "compiled"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1]))


def offline_rate(weights: str, dtype: str, shape: str, mode: str) -> float:
    """The engine alone at batch 1, its model "compiled" as `minivtc serve` compiles it, or
    "eager" (packed) as `--enforce-eager` runs it: new tokens per second of one request,
    prefill included, as guidellm counts a stream's (the median of 5, after one to warm up)."""
    from minivtc.engine.factory import build_engine, compile_shapes
    from minivtc.model.weights import load_model
    from minivtc.requests.params import SamplingParams

    prompt_tokens, new_tokens = (int(n) for n in shape.split(","))
    model, _ = load_model(weights, dtype, packed=mode == "eager", compiled=mode == "compiled")
    if mode == "compiled":
        compile_shapes(model)
    engine = build_engine(model, None, kv_tokens=prompt_tokens + new_tokens + 16)
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    rates = []
    for k in range(6):
        prompt = [1] + [100 + (k * 7 + i) % 800 for i in range(prompt_tokens - 1)]
        start = time.perf_counter()
        engine.add_request(prompt, params)
        while engine.has_unfinished():
            engine.step()
        rates.append(new_tokens / (time.perf_counter() - start))
    return statistics.median(rates[1:])


def table(results: dict[str, list[dict[int, dict]]], streams: list[int]) -> str:
    """Per stream count: each server's tokens/s (median of rounds), minivtc / vLLM (median of
    the rounds' ratios, [range]), TTFT p50 / p99 over every request of every round, failures."""
    names = list(results)
    head = ["streams"] + [f"{n} tok/s" for n in names]
    others = [n for n in names if n != "vllm"] if "vllm" in results else []
    head += [f"{n} / vllm" for n in others]
    head += [f"{what}, {n}" for n in names for what in ("TTFT p50 / p99 ms", "failed")]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for s in streams:
        row = [str(s)]
        row += [f"{statistics.median(r[s]['tokens_s'] for r in results[n]):,.0f}" for n in names]
        for n in others:
            pairs = zip(results[n], results["vllm"], strict=True)
            row.append(spread([m[s]["tokens_s"] / v[s]["tokens_s"] for m, v in pairs]))
        for n in names:
            ttfts = sorted(t for r in results[n] for t in r[s]["ttfts"])
            p99 = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))]
            row.append(f"{ttfts[len(ttfts) // 2]:.0f} / {p99:.0f}")
            row.append(str(sum(r[s]["failed"] for r in results[n])))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
