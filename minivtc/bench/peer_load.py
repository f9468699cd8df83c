"""`minivtc bench peer --load`: the time to first token under the same offered load, minivtc's
server beside vLLM's OpenAI server on the same model.

Both servers start once (FCFS: one client, so any fair policy would order the same), then take
turns: each turn replays a Poisson trace (the round's seed, the same for both) for 20 s and waits
for it to drain, through the load generator every replay here uses (`serving/loadgen.py`). Per
server: time to first token median and 90th percentile over every request of every turn, the
served output tokens/s, and minivtc's ratio to vLLM within each turn.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

from minivtc.gateway.proxy import wait_healthy
from minivtc.serving.loadgen import ReplayResult, run_replay
from minivtc.sim.workloads import poisson

__all__ = ["bench_load"]

PROMPT_LEN, TURN_S = 32, 20.0
PORTS = {"minivtc": 18431, "vllm": 18432}


def bench_load(
    args: argparse.Namespace,
    weights: str,
    rate: float,
    vllm: str | None,
    env: dict[str, str],
    rounds: int,
) -> None:
    if vllm is None:
        print("TTFT under load: needs vLLM's venv (--vllm-python), like its columns")
        return
    turn_s = 5.0 if args.quick else TURN_S
    max_len = PROMPT_LEN + args.new_tokens + 16
    commands = {
        "minivtc": [sys.executable, "-m", "minivtc", "serve", "--weights", weights]
        + ["--dtype", args.dtype, "--scheduler", "fcfs", "--max-num-seqs", "64"]
        + ["--max-model-len", str(max_len), "--served-model-name", "peer"]
        + ["--port", str(PORTS["minivtc"]), "--disable-log-requests"],
        "vllm": [vllm, "-m", "vllm.entrypoints.openai.api_server", "--model", weights]
        + ["--dtype", {"fp32": "float32", "bf16": "bfloat16"}[args.dtype]]
        + ["--max-num-seqs", "64", "--max-model-len", str(max_len)]
        + ["--served-model-name", "peer", "--port", str(PORTS["vllm"])],
    }
    print(
        f"TTFT under load: Poisson arrivals at {rate:.2f} requests/s ({args.load_fraction:.0%} of "
        f"the slower engine's batch-16 throughput), prompts of {PROMPT_LEN} ids, "
        f"{args.new_tokens} new tokens, {turn_s:.0f} s per turn, {rounds} turns each"
    )
    servers = {}
    try:
        for name, command in commands.items():
            print(f"starting {name}'s server ...", flush=True)
            log = open(f"peer-{name}-server.log", "w")  # noqa: SIM115 (closed with the process)
            servers[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
            wait_healthy(f"http://127.0.0.1:{PORTS[name]}", 600, servers[name])
        results: dict[str, list[ReplayResult]] = {name: [] for name in commands}
        for k in range(rounds):
            trace = poisson([rate], turn_s, [(PROMPT_LEN, args.new_tokens)], seed=k)
            for name in list(commands)[k % 2 :] + list(commands)[: k % 2]:
                url = f"http://127.0.0.1:{PORTS[name]}"
                result = run_replay(url, trace, drain_s=120, progress=False, model="peer")
                results[name].append(result)
            print(f"turn {k + 1}/{rounds} done", flush=True)
        print(load_table(results))
    finally:
        for process in servers.values():
            process.terminate()
            process.wait(timeout=60)


def load_table(results: dict[str, list[ReplayResult]]) -> str:
    lines = [
        f"{'server':<8} {'TTFT median':>12} {'TTFT p90':>9} {'served tok/s':>13} {'failed':>7}"
    ]
    medians: dict[str, list[float]] = {}
    for name, turns in results.items():
        ttft = sorted(s.first_token_latency_s for r in turns for s in r.served)
        tps = [sum(s.output_tokens for s in r.served) / r.wall_s for r in turns]
        failed = sum(sum(r.failed.values()) + r.unfinished for r in turns)
        medians[name] = [
            statistics.median(s.first_token_latency_s for s in r.served) for r in turns
        ]
        p90 = ttft[int(0.9 * (len(ttft) - 1))]
        lines.append(
            f"{name:<8} {statistics.median(ttft):>10.3f} s {p90:>7.3f} s "
            f"{statistics.median(tps):>13,.0f} {failed:>7}"
        )
    ratio = [v / m for v, m in zip(medians["vllm"], medians["minivtc"], strict=True)]
    lo, mid, hi = min(ratio), statistics.median(ratio), max(ratio)
    lines.append(f"vLLM's median TTFT / minivtc's, turn by turn: {mid:.2f}x [{lo:.2f}, {hi:.2f}]")
    return "\n".join(lines)
