"""One engine in a process of its own, for `minivtc bench peer`: it loads once, then runs each
batch it is sent and answers with the times and the tokens.

    python -m minivtc.bench.peer_worker minivtc WEIGHTS --dtype bf16 [--plain]
    python -m minivtc.bench.peer_worker vllm WEIGHTS --dtype bf16 [--eager]   # in vLLM's venv
    python -m minivtc.bench.peer_worker transformers WEIGHTS --dtype bf16

Its standard input takes one JSON line per run, `{"prompts": [[ids...], ...], "new_tokens": N}`
(greedy, EOS ignored: every request generates N tokens); its answer is one line starting with
`ANSWER` (an engine may print its own log lines around it) holding the run's wall seconds, the
CPU seconds of this process and every process it started (vLLM runs its engine core in a child
process: counting only this one would miss the work), and each request's tokens. An empty line
or end of input ends it. It imports only what its engine needs, so the minivtc worker runs without
vLLM and the vLLM worker runs in vLLM's own virtual environment (which pins its own packages).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

__all__ = ["ANSWER", "proc_stats", "process_tree", "top_logits", "tree_cpu_seconds"]

if TYPE_CHECKING:
    from minivtc.model.llama import Llama

ANSWER = "ANSWER "  # the prefix of the worker's answer lines
Run = Callable[[list[list[int]], int], list[list[int]]]
# minivtc's run also times its decode steps (every step after the first, which prefills and
# makes the first tokens), for the bench's bandwidth line; `main` moves it into the answer
DECODE_S: dict[str, float] = {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m minivtc.bench.peer_worker", description=__doc__
    )
    parser.add_argument("engine", choices=["minivtc", "vllm", "transformers"])
    parser.add_argument("weights", help="a Hugging Face Llama directory")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--eager", action="store_true", help="vllm: enforce_eager (no graph)")
    parser.add_argument("--plain", action="store_true", help="minivtc: nn.Linear, not packed")
    parser.add_argument("--compiled", action="store_true", help="minivtc: compile_model")
    parser.add_argument("--max-batch", type=int, default=64, help="the largest batch sent")
    parser.add_argument("--max-len", type=int, default=256, help="prompt + new tokens, at most")
    parser.add_argument("--threads", type=int, default=None, help="torch's threads (minivtc, hf)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    loaders = {"minivtc": load_minivtc, "vllm": load_vllm, "transformers": load_transformers}
    run = loaders[args.engine](args)
    print(ANSWER + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        ask = json.loads(line)
        if "top_logits" in ask:  # the plain path's view of a prefix: see `top_logits`
            print(ANSWER + json.dumps(top_logits(args.weights, ask["top_logits"])), flush=True)
            continue
        cpu, wall = tree_cpu_seconds(), time.perf_counter()
        tokens = run(ask["prompts"], ask["new_tokens"])
        wall, cpu = time.perf_counter() - wall, tree_cpu_seconds() - cpu
        answer = {"wall_s": wall, "cpu_s": cpu, "tokens": tokens}
        if "last" in DECODE_S:
            answer["decode_s"] = DECODE_S.pop("last")
        print(ANSWER + json.dumps(answer), flush=True)
    return 0


def top_logits(weights: str, ids: list[int], k: int = 5) -> dict[str, list]:
    """The k largest next-token logits after `ids`, in fp32 through the plain path (the whole
    sequence at once, no KV cache): where two engines' greedy tokens part, this says whether
    the two were a near tie, which float rounding decides, or apart, which only a bug explains."""
    import torch

    from minivtc.model.llama import CausalSequences

    model = fp32_model(weights)
    tokens = torch.tensor(ids)
    logits = model(
        tokens,
        torch.arange(len(ids)),
        CausalSequences([len(ids)]),
        tokens.new_tensor([len(ids) - 1]),
    )
    top = torch.topk(logits[0], k)
    return {"ids": top.indices.tolist(), "logits": top.values.tolist()}


def load_minivtc(args: argparse.Namespace) -> Run:
    import torch

    from minivtc.engine.factory import build_engine
    from minivtc.model.weights import load_model
    from minivtc.requests.params import SamplingParams

    torch.set_grad_enabled(False)
    packed = not (args.plain or args.compiled)
    model, _ = load_model(args.weights, dtype=args.dtype, packed=packed, compiled=args.compiled)
    # one engine for every run, its pool sized for the largest batch (as vLLM's is, at start)
    kv_tokens = args.max_batch * args.max_len
    engine = build_engine(model, None, kv_tokens=kv_tokens, max_running=args.max_batch)

    def run(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
        requests = [engine.add_request(p, params) for p in prompts]
        engine.step()  # the prefill: the first token of every request
        start = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        DECODE_S["last"] = time.perf_counter() - start
        return [list(r.output_ids) for r in requests]

    return run


def load_vllm(args: argparse.Namespace) -> Run:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=args.weights,
        dtype={"fp32": "float32", "bf16": "bfloat16"}[args.dtype],
        enforce_eager=args.eager,
        max_num_seqs=args.max_batch,
        max_model_len=args.max_len,
        seed=0,
    )

    def run(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
        asked = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        outputs = llm.generate(asked, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]

    return run


def load_transformers(args: argparse.Namespace) -> Run:
    import torch
    import transformers

    torch.set_grad_enabled(False)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    hf = transformers.LlamaForCausalLM.from_pretrained(args.weights, dtype=dtype).eval()

    def run(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        ids = torch.tensor(prompts)  # the bench sends prompts of one length: no padding
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        return out[:, ids.shape[1] :].tolist()

    return run


@functools.cache
def fp32_model(weights: str) -> Llama:
    from minivtc.model.weights import load_model

    return load_model(weights, dtype="fp32")[0]


def tree_cpu_seconds(*roots: int) -> float:
    """User + system CPU seconds of the processes `roots` (this one, if none) and every live
    process under them, from one reading of /proc (Linux). A child's time counts while it lives,
    which is what a benchmark of a long-lived engine process needs (`resource.RUSAGE_CHILDREN`
    counts only ended children)."""
    stats = proc_stats(Path("/proc"))
    trees = {pid for root in roots or (os.getpid(),) for pid in process_tree(root, stats)}
    return sum(stats[pid][2] for pid in trees)


def process_tree(root: int, stats: dict[int, tuple[str, int, float]]) -> list[int]:
    """`root` and every live process under it (vLLM's engine core runs in one), in `stats`
    (`proc_stats` of /proc)."""
    parents = {pid: parent for pid, (_, parent, _) in stats.items()}
    tree = []
    for pid in parents:
        p = pid
        while p not in (root, 0, 1) and p in parents:
            p = parents[p]
        if p == root:
            tree.append(pid)
    return tree


def proc_stats(folder: Path) -> dict[int, tuple[str, int, float]]:
    """For each numbered entry of `folder` (/proc, or a process's task/ folder: its threads):
    its name, its parent and its user + system CPU seconds, from its `stat`. One that ended
    while we looked is left out."""
    tick, stats = os.sysconf("SC_CLK_TCK"), {}
    for entry in folder.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended while we looked
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (name) "
        stats[int(entry.name)] = (name, int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return stats


if (
    __name__ == "__main__"
):  # vLLM starts processes of its own: the guard keeps them from rerunning this
    sys.exit(main())
