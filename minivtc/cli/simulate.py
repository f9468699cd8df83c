"""The simulator's commands: `minivtc simulate`, `minivtc reproduce`, `minivtc calibrate`.

Owns their argument parsing and terminal output, and two helpers the load generator's command
shares (`add_trace_source`: --workload or --trace; `print_summary`). `minivtc.cli.main` gathers
every command.
"""

from __future__ import annotations

__all__ = ["add_calibrate", "add_memory_options", "add_prefix_options", "add_reproduce"]
__all__ += ["add_simulate", "add_trace_source", "config_of", "print_summary"]


def add_simulate(sub) -> None:
    from minivtc.fairness.policies import SCHEDULERS
    from minivtc.fleet.replica_workloads import FLEET_WORKLOADS
    from minivtc.sim.step_time import STEP_TIME_MODELS

    p = sub.add_parser(
        "simulate",
        help="replay a workload through the engine on a virtual clock (no model needed)",
        description="Run the real engine and scheduler on a virtual clock, with a step-time model "
        "timing each step instead of a forward pass. Writes requests.csv, metrics.json and "
        "PNG plots (service, response time, service gap) to --out.",
    )
    add_trace_source(p, extra=tuple(FLEET_WORKLOADS))
    p.add_argument("--scheduler", default="vtc", help=f"policy: {SCHEDULERS} (default vtc)")
    p.add_argument(
        "--step-time",
        "--cost-model",
        default="a10g-llama7b",
        dest="step_time",
        help=f"{', '.join(STEP_TIME_MODELS)}, 'measured' (this machine: run `minivtc calibrate` "
        "first) or a .json file from calibrate (default a10g-llama7b)",
    )
    p.add_argument("--kv-tokens", type=int, default=10000, help="KV pool in tokens (default 10000)")
    p.add_argument(
        "--block-size",
        type=int,
        default=1,
        help="tokens per KV block (default 1, S-LoRA's token-granular pool the paper ran on; "
        "a prefix cache shares whole blocks, so use e.g. 16 with --prefix-caching)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed for randomised policies (vtc-oracle:p)"
    )
    add_memory_options(p, default="peak")
    add_prefix_options(p)
    add_fleet_options(p)
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(run=run_simulate)


def add_memory_options(p, default: str) -> None:
    """--reservation, --victim, --preemption, --swap-tokens, --preempt-gap (the simulator's
    and the server's; `config_of` reads them)."""
    p.add_argument(
        "--reservation",
        choices=["full", "peak", "none"],
        default=default,
        help="KV admission: 'full' reserves prompt + max_tokens (Lemma 4.3's proof condition), "
        "'peak' the artifact's peak check, 'none' allocates blocks on demand and preempts a "
        f"--victim when they run out (default {default})",
    )
    p.add_argument(
        "--victim",
        choices=["latest", "fair"],
        default=None,
        help="with --reservation none, whom to preempt: 'latest' (vLLM's: the most recently "
        "admitted) or 'fair' (the running client with the highest counter, which is also "
        "preempted when it leads a waiting client by --preempt-gap) (default latest)",
    )
    p.add_argument(
        "--preemption",
        choices=["recompute", "swap"],
        default=None,
        help="with --reservation none, what a preempted request keeps: nothing ('recompute': "
        "its prompt and tokens are prefilled again) or its keys and values, copied to host "
        "memory and back ('swap') (default recompute)",
    )
    p.add_argument(
        "--swap-tokens",
        type=int,
        default=None,
        metavar="N",
        help="with --preemption swap: host memory for swapped keys and values, in tokens "
        "(default: as many as the KV pool holds); a preemption that would need more recomputes",
    )
    p.add_argument(
        "--preempt-gap",
        type=float,
        default=None,
        metavar="G",
        help="with --victim fair: how far (in service units, w_p = 1 per prompt token, w_q = 2 "
        "per output token) a running client may lead a waiting one before it is preempted to "
        "make room; smaller is fairer (the bound is 2 (max(G, w_p L_input) + w_q B), so below "
        "the longest prompt's charge it tightens nothing) and recomputes more; at least one "
        "block's decode charge, w_q x block size (default w_q M / 4, a quarter of the "
        "non-preemptive bound's M term)",
    )


def config_of(args, **keywords):
    """The engine's config (`engine_config.EngineConfig`, which refuses what would be silently
    ignored) from --scheduler, --reservation, --victim, --preemption, --swap-tokens,
    --preempt-gap, --prefix-caching and --cached-weight (which needs --prefix-caching), with
    the command's own `keywords` (the pool, the seed, the weights)."""
    from minivtc.engine.engine_config import EngineConfig

    if args.cached_weight is not None and not args.prefix_caching:
        raise ValueError("--cached-weight only means something with --prefix-caching")
    return EngineConfig.of(
        args.scheduler,
        reservation=args.reservation,
        victim=args.victim,
        preempt_gap=args.preempt_gap,
        preemption=args.preemption,
        swap_tokens=args.swap_tokens,
        prefix_caching=args.prefix_caching,
        cached_weight=args.cached_weight,
        **keywords,
    )


def add_prefix_options(p) -> None:
    """--prefix-caching and --cached-weight (the simulator's and the server's)."""
    p.add_argument(
        "--prefix-caching",
        action="store_true",
        help="cache full prompt blocks and share them between requests with the same prefix "
        "(their prefill starts after it); cached blocks nobody holds are evicted, least "
        "recently used first, before any running work is preempted",
    )
    p.add_argument(
        "--cached-weight",
        type=float,
        default=None,
        metavar="W",
        help="what VTC charges for a prompt token found in the prefix cache, 0 <= W <= w_p "
        "(w_p = 1 with the paper's cost; default w_p: caching changes no one's charge; 0: "
        "cached tokens are free)",
    )


def run_simulate(args) -> int:
    from minivtc.experiments.report import simulate_to_dir

    if args.replicas is not None:
        from minivtc.cli.replicas_flags import run_simulate_fleet

        return run_simulate_fleet(args)
    config = config_of(args, kv_tokens=args.kv_tokens, block_size=args.block_size, seed=args.seed)
    summary = simulate_to_dir(args.workload or args.trace, config, args.step_time, args.out)
    print_summary(summary)
    print(f"wrote {args.out}/requests.csv, metrics.json, service.png, response.png, gap.png")
    return 0


def add_fleet_options(p) -> None:
    """--replicas, --routing, --route-by (`minivtc.cli.replicas_flags`)."""
    from minivtc.cli.replicas_flags import add_fleet_options as add

    add(p)


def add_trace_source(p, extra: tuple[str, ...] = ()) -> None:
    """--workload NAME or --trace FILE.csv, exactly one (simulate and loadgen); `extra`:
    more workload names the command knows (simulate: the fleet's)."""
    from minivtc.sim.workloads import WORKLOADS

    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--workload", choices=[*WORKLOADS, *extra], help="one of the paper's workloads"
    )
    src.add_argument(
        "--trace",
        help="a CSV with columns client,arrival_s,input_tokens,output_tokens "
        "(and optionally max_tokens: the request's limit, when it ends before it; prefix_id "
        "and prefix_tokens: requests with the same prefix_id share their first prefix_tokens)",
    )


def print_summary(summary: dict) -> None:
    """metrics.json's scalar entries, one per line."""
    for key, value in summary.items():
        if not isinstance(value, dict):
            print(f"{key:>22}: {value}")


def add_reproduce(sub) -> None:
    p = sub.add_parser(
        "reproduce",
        help="run the paper's experiments in simulation and write REPORT.md",
        description="Simulate the paper's experiments (Figures 3-10, 12-16, 19; Tables 2-6) on "
        "the calibrated A10G step-time model (the 13B ablation on the A100 one fitted to its "
        "measured runs) and write "
        "REPORT.md: each table beside the paper's numbers, a one-line verdict per claim, and the "
        "figures as PNGs. About 2 minutes on a 2-core laptop; --only picks some.",
    )
    p.add_argument(
        "--only",
        action="append",
        help="comma-separated keys, or the option repeated (default: all): fig3 ... fig10, "
        "fig12, fig13 (13-14), fig15, fig16, table2 ... table6 (table5 includes Figure 19), "
        "validate (the simulator against the artifact's measured A10G runs), prefix_caching "
        "(what a cached prompt token should cost), fair_memory (reservation vs blocks on "
        "demand with preemption, max_tokens 1024), replicas (one fair dispatcher against "
        "per-replica counters at 8 and 64 replicas, ~3 minutes)",
    )
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(run=run_reproduce)


def run_reproduce(args) -> int:
    from minivtc.experiments.report import reproduce

    # --only a,b and --only a --only b alike (a repeated option must not drop the first)
    only = [k.strip() for keys in args.only for k in keys.split(",")] if args.only else None
    print(f"wrote {reproduce(args.out, only)}")
    return 0


def add_calibrate(sub) -> None:
    from minivtc.sim.step_time import DEFAULT_PATH

    p = sub.add_parser(
        "calibrate",
        help="measure this machine's step times: the 'measured' step-time model for simulate",
        description="Time every step of the real engine on the bundled model over a grid of "
        "batch sizes and prompt lengths, fit step time = overhead + a * prefill tokens + "
        "b * requests + c * context tokens, check the fit on a held-out workload (real vs "
        "simulated seconds) and write the model as JSON. About a minute.",
    )
    p.add_argument(
        "--out", default=str(DEFAULT_PATH), help=f"where to write (default {DEFAULT_PATH})"
    )
    p.add_argument("--quick", action="store_true", help="a small grid (seconds; a rough fit)")
    p.set_defaults(run=run_calibrate)


def run_calibrate(args) -> int:
    from minivtc.sim import calibrate

    calibrate.main(args.out, args.quick)
    return 0
