"""The `minivtc` command: one subcommand per job, each with a --help that explains it.

Owns argument parsing and terminal output only; every subcommand calls into the package.
"""

from __future__ import annotations

import argparse
import sys

from minivtc.cli.instructor import add_course
from minivtc.cli.route import add_route
from minivtc.cli.serve import add_serve, bind_threads, port
from minivtc.cli.simulate import (
    add_calibrate,
    add_reproduce,
    add_simulate,
    add_trace_source,
    print_summary,
)
from minivtc.serving.allocator import restart_on

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="minivtc",
        description="minivtc: a teaching Llama-2 engine with the Virtual Token Counter fair "
        "scheduler (Sheng et al., OSDI 2024). Every command runs on the bundled tiny model "
        "by default.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_demo(sub)
    add_generate(sub)
    add_serve(sub)
    add_route(sub)
    add_loadgen(sub)
    add_simulate(sub)
    add_reproduce(sub)
    add_calibrate(sub)
    add_bench(sub)
    add_course(sub)
    args = parser.parse_args(argv)
    # from the command line only: a process main() was called in (a test, a notebook) stays
    if argv is None and args.command == "serve":
        bind_threads()
    if argv is None and args.command in ("serve", "demo"):
        restart_on(sys.argv[1:])  # the fast allocator (serving/allocator.py)
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError) as e:  # bad input: say what is wrong, no traceback
        print(f"minivtc {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


def add_demo(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="FCFS vs VTC on real tokens over HTTP: a table and a plot in ~3 minutes",
        description="Start the server in-process on the bundled model and replay a workload "
        "with a heavy client (3x the rate) and a light one, overloading this machine: first "
        "under FCFS, then under VTC, about a minute each. Prints per-client service and time "
        "to first token side by side and writes demo.png to --out.",
    )
    p.add_argument("--out", default="demo-out", help="output directory (default demo-out)")
    p.add_argument(
        "--duration", type=float, default=60.0, help="seconds of arrivals per run (default 60)"
    )
    p.add_argument(
        "--drain",
        type=float,
        default=10.0,
        help="seconds to let the last requests finish before cancelling them (default 10)",
    )
    p.add_argument(
        "--dashboard",
        nargs="?",
        type=port,
        const=8000,
        default=None,
        metavar="PORT",
        help="serve each run on 127.0.0.1:PORT (default 8000) and print the address of its "
        "live dashboard, /dashboard, to watch the counters move in a browser while FCFS and "
        "then VTC serve the workload",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=None,
        metavar="N",
        help="N minivtc serve backends (>= 2) instead of one: the fair gateway in front (one "
        "VTC for them all) vs a round-robin router (each backend queueing behind its own VTC), "
        "the same table",
    )
    p.set_defaults(run=run_demo)


def run_demo(args) -> int:
    from minivtc.serving import demo

    if args.duration <= 0 or args.drain < 0:
        raise ValueError("--duration must be > 0 and --drain >= 0")
    if args.replicas is not None:
        if args.dashboard is not None:
            raise ValueError(
                "--dashboard watches one server; with --replicas, open each backend's "
                "/dashboard or the gateway's (minivtc route prints its address)"
            )
        from minivtc.gateway import demo_replicas

        demo_replicas.main(args.out, args.duration, args.drain, args.replicas)
        return 0
    demo.main(args.out, args.duration, args.drain, dashboard=args.dashboard)
    return 0


def add_loadgen(sub) -> None:

    p = sub.add_parser(
        "loadgen",
        help="replay a workload against an OpenAI-compatible server; measure fairness",
        description="Send one streaming request per trace arrival (client in X-Client-Id, "
        "max_tokens = the trace's output length, EOS ignored), record time to first token and "
        "latency per request, and write requests.csv, metrics.json and plots to --out, the "
        "same files `minivtc simulate` writes.",
    )
    p.add_argument(
        "--url",
        required=True,
        action="append",
        help="server root, e.g. http://127.0.0.1:8000; repeat it for several servers: requests "
        "go to them round-robin in arrival order (the per-replica baseline)",
    )
    add_trace_source(p)
    p.add_argument("--speedup", type=float, default=1.0, help="replay X times faster (default 1)")
    p.add_argument(
        "--duration", type=float, default=None, help="send only the first S s (trace time)"
    )
    p.add_argument(
        "--drain",
        type=float,
        default=None,
        help="after the last arrival, wait at most this many seconds (default: until done)",
    )
    p.add_argument("--model", default=None, help="model name to send (default: none)")
    p.add_argument(
        "--no-ignore-eos",
        action="store_true",
        help="do not send vLLM's ignore_eos (for servers that reject unknown fields)",
    )
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(run=run_loadgen)


def run_loadgen(args) -> int:
    import asyncio

    from minivtc.serving.loadgen import replay, write_run
    from minivtc.sim.workloads import read_trace, workload

    trace = workload(args.workload).make() if args.workload else read_trace(args.trace)
    result = asyncio.run(
        replay(
            args.url,
            trace,
            args.speedup,
            args.duration,
            args.drain,
            args.model,
            ignore_eos=not args.no_ignore_eos,
        )
    )
    print_summary(write_run(result, args.out))
    print(f"wrote {args.out}/requests.csv, metrics.json, service.png, response.png")
    return 0 if result.served else 1


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
    """One prompt through the engine, its text streamed as the server streams it (the engine's
    detokenizer and stop rules, `Engine.output`), on a pool just large enough for it."""
    from minivtc.engine.factory import build_engine
    from minivtc.engine.sampler import SamplingParams
    from minivtc.model.weights import load_model

    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        stop=tuple(args.stop),
        seed=args.seed,
    )
    model, tokenizer = load_model(args.weights, args.dtype, args.device)
    if args.chat:
        prompt_ids = tokenizer.chat_ids([{"role": "user", "content": args.prompt}])
    else:
        prompt_ids = tokenizer.encode(args.prompt)
        print(args.prompt, end="", flush=True)
    room = model.config.max_positions
    max_tokens = params.with_max_tokens(room - len(prompt_ids)).limit
    kv_tokens = min(room, len(prompt_ids) + max_tokens)
    engine = build_engine(model, tokenizer, kv_tokens=kv_tokens, compile_attention=False)
    request = engine.add_request(prompt_ids, params)
    while engine.has_unfinished():
        engine.step()
        out = engine.output(request)
        print(out.text_delta, end="", flush=True)
    print()
    if request.error is not None:
        raise ValueError(request.error)
    print(f"[{len(request.output_ids)} tokens]", file=sys.stderr)
    return 0


def add_bench(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmarks measured on this machine (engine, peer, scheduler, sim, gpu)",
        description="minivtc bench engine [--quick]: decode throughput of the engine vs "
        "transformers vs a contiguous cache at batch 1/16/64. minivtc bench peer [--dtype bf16] "
        "[--load]: minivtc beside vLLM and transformers, each in its own process, taking turns. "
        "minivtc bench scheduler: VTC's "
        "heap vs a linear scan. minivtc bench sim: simulated s per wall s. "
        "minivtc bench gpu [--preset P]: "
        "the GPU check (7B shape, compiled attention, roofline). See python -m minivtc.bench -h.",
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="what to run, and its options")
    p.set_defaults(run=run_bench)


def run_bench(args) -> int:
    from minivtc.bench import suite

    return suite.main(args.args)


if __name__ == "__main__":
    sys.exit(main())
