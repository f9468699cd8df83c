"""The `minivtc` command: one subcommand per job, each with a --help that explains it.

Owns argument parsing and terminal output only; every subcommand calls into the package.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="minivtc",
        description="minivtc: a teaching Llama-2 engine with the Virtual Token Counter fair "
        "scheduler (Sheng et al., OSDI 2024). Every command runs on the bundled tiny model "
        "by default.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_generate(sub)
    add_simulate(sub)
    add_reproduce(sub)
    add_bench(sub)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError) as e:  # bad input: say what is wrong, no traceback
        print(f"minivtc {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


def add_generate(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="generate text from a prompt, streamed to the terminal",
        description="Generate a continuation of --prompt with the plain (one request, "
        "contiguous KV cache) path, printing text as it is produced. Greedy when "
        "--temperature is 0; sampling is reproducible with --seed.",
    )
    p.add_argument(
        "--prompt", required=True, help="the text to continue (or the user turn with --chat)"
    )
    p.add_argument(
        "--max-tokens", type=int, default=64, help="tokens to generate at most (default 64)"
    )
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default 0.95)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k likeliest tokens; 0 = all")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--stop", action="append", default=[], help="stop sequence (repeatable)")
    p.add_argument(
        "--weights", default=None, help="Hugging Face Llama directory (default: bundled)"
    )
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the Llama-2 chat format")
    p.set_defaults(run=run_generate)


def run_generate(args) -> int:
    from minivtc.generate import generate_plain, releasable, stop_reason, trim_stop
    from minivtc.sampler import SamplingParams
    from minivtc.weights import load_model

    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        max_tokens=args.max_tokens, stop=tuple(args.stop), seed=args.seed,
    )  # fmt: skip
    model, tokenizer = load_model(args.weights, args.dtype, args.device)
    if args.chat:
        prompt_ids = tokenizer.chat_ids([{"role": "user", "content": args.prompt}])
    else:
        prompt_ids = tokenizer.encode(args.prompt)
    detok = tokenizer.detokenizer(prompt_ids)
    if not args.chat:
        print(args.prompt, end="", flush=True)
    printed, count = 0, 0
    for token in generate_plain(model, prompt_ids, params):
        count += 1
        detok.add(token)
        reason = stop_reason(token, count, detok.text, params, tokenizer.eos_id)
        text = detok.text
        if reason:
            text = text + detok.flush()
            text = trim_stop(text, params.stop) if reason == "stop" else text
        upto = max(printed, releasable(text, params.stop, finished=reason is not None))
        print(text[printed:upto], end="", flush=True)
        printed = upto
        if reason:
            break
    print()
    print(f"[{count} tokens]", file=sys.stderr)
    return 0


def add_simulate(sub) -> None:
    from minivtc.scheduler import SCHEDULERS
    from minivtc.sim import COST_MODELS
    from minivtc.workloads import WORKLOADS

    p = sub.add_parser(
        "simulate",
        help="replay a workload through the engine on a virtual clock (no model needed)",
        description="Run the real engine and scheduler on a virtual clock, with a cost model "
        "timing each step instead of a forward pass. Writes requests.csv, metrics.json and "
        "PNG plots (service, response time, service gap) to --out.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", choices=list(WORKLOADS), help="one of the paper's workloads")
    src.add_argument(
        "--trace", help="a CSV with columns client,arrival_s,input_tokens,output_tokens"
    )
    p.add_argument("--scheduler", default="vtc", help=f"policy: {SCHEDULERS} (default vtc)")
    p.add_argument("--cost-model", default="a10g-llama7b", choices=list(COST_MODELS))
    p.add_argument("--kv-tokens", type=int, default=10000, help="KV pool in tokens (default 10000)")
    p.add_argument(
        "--seed", type=int, default=0, help="seed for randomised policies (vtc-oracle:p)"
    )
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(run=run_simulate)


def run_simulate(args) -> int:
    from minivtc.report import simulate_to_dir

    summary = simulate_to_dir(args.workload, args.trace, args.scheduler, args.cost_model,
                              args.kv_tokens, args.seed, args.out)  # fmt: skip
    for key, value in summary.items():
        if not isinstance(value, dict):
            print(f"{key:>22}: {value}")
    print(f"wrote {args.out}/requests.csv, metrics.json, service.png, response.png, gap.png")
    return 0


def add_reproduce(sub) -> None:
    p = sub.add_parser(
        "reproduce",
        help="run the paper's experiments in simulation and write REPORT.md",
        description="Simulate the paper's experiments (Figures 3-10, 16; Tables 2-6) on the "
        "calibrated A10G cost model and write REPORT.md: each table beside the paper's numbers, "
        "a one-line verdict per claim, and the figures as PNGs. A few minutes on a laptop.",
    )
    p.add_argument("--only", help="comma-separated keys, e.g. fig3,table2 (default: all)")
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(run=run_reproduce)


def run_reproduce(args) -> int:
    from minivtc.report import reproduce

    only = [k.strip() for k in args.only.split(",")] if args.only else None
    print(f"wrote {reproduce(args.out, only)}")
    return 0


def add_bench(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmarks measured on this machine (engine, scheduler, sim, gpu)",
        description="minivtc bench engine [--quick]: decode throughput of the engine vs "
        "transformers vs a contiguous cache at batch 1/16/64. minivtc bench scheduler: VTC's "
        "heap vs a linear scan. minivtc bench sim: simulated s per wall s. "
        "minivtc bench gpu [--preset P]: "
        "the GPU check (7B shape, compiled attention, roofline). See python -m minivtc.bench -h.",
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="what to run, and its options")
    p.set_defaults(run=run_bench)


def run_bench(args) -> int:
    from minivtc import bench

    return bench.main(args.args)


if __name__ == "__main__":
    sys.exit(main())
