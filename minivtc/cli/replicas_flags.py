"""The fleet's command-line options: `minivtc simulate --replicas N --routing R --route-by B`.

Owns their parsing and terminal output; `cli/simulate.py`'s simulate calls in here when
--replicas is given. (`minivtc route`, the gateway, is `route.py`'s.)
minivtc/fleet/README.md; Lesson 14.
"""

from __future__ import annotations

from minivtc.fleet.replicas import ROUTINGS

__all__ = ["add_fleet_options", "run_simulate_fleet"]


def add_fleet_options(p) -> None:
    p.add_argument(
        "--replicas",
        type=int,
        default=None,
        metavar="N",
        help="simulate N replicas (each a real engine with --kv-tokens and its step-time "
        "model) on one virtual clock; the workload's arrivals are scaled by N",
    )
    p.add_argument(
        "--routing",
        choices=ROUTINGS,
        default="global",
        help="with --replicas: 'global', one fair dispatcher holding every client's queue and "
        "counter in front of the replicas, binding a request only where it fits; or the "
        "field's practice, a replica chosen at arrival, each replica queueing behind its own "
        "--scheduler: 'round-robin', 'least-loaded', 'random', 'prefix' (cache affinity: a "
        "shared prompt prefix goes where it went first) (default global)",
    )
    p.add_argument(
        "--route-by",
        choices=["least-loaded", "prefix"],
        default="least-loaded",
        help="with --routing global: where among the replicas with room, the least loaded or "
        "the one that last served the prompt's prefix (changes no counter, so no bound) "
        "(default least-loaded)",
    )

    p.add_argument(
        "--staleness",
        type=float,
        default=0.0,
        metavar="TAU",
        help="with --routing global: the dispatcher hears of each replica step TAU seconds "
        "after it ends (tokens charged, rooms freed then); the bound gains 2 w_q G, G the most "
        "output tokens one client received unseen (default 0: an exact view)",
    )
    p.add_argument(
        "--gateways",
        type=int,
        default=None,
        metavar="K",
        help="with --routing global: K gateways in front of the replicas, each with its own "
        "policy, sharing a store (--sync) or not (--no-store: each alone on a 1/K slice of every "
        "replica); the bound (ours) is 2U + 2 Delta + 2S (minivtc/fleet/README.md)",
    )
    p.add_argument(
        "--sync",
        type=float,
        default=0.05,
        metavar="TAU",
        help="with --gateways: seconds between each gateway's syncs with the store (default 0.05)",
    )
    p.add_argument("--no-store", action="store_true", help="with --gateways: no shared store")
    p.add_argument(
        "--ingress",
        choices=["balanced", "skewed", "swapped"],
        default="balanced",
        help="with --gateways: each client's requests through the gateways in turn, or each "
        "client through one gateway (skewed: the first client seen through gateway 0; swapped: "
        "the reverse) (default balanced)",
    )
    p.add_argument(
        "--dynamo-table",
        action="store_true",
        help="with --gateways K: print Dynamo's two-router table (its issue #15187) for the "
        "'pair' workload at --replicas N: one gateway; K with balanced, skewed and swapped "
        "ingress; each without and with the store at --sync (writes DIR/table.md)",
    )


def routing_of(args):
    """--routing, or with --gateways the gateways' spec (--ingress, --sync, --no-store)."""
    from minivtc.fleet.gateways import GatewaySpec

    if args.gateways is None:
        if args.no_store or args.ingress != "balanced":
            raise ValueError("--no-store and --ingress need --gateways")
        return args.routing
    if args.routing != "global":
        raise ValueError("--gateways: each gateway is a global dispatcher (--routing global)")
    return GatewaySpec(args.gateways, args.ingress, None if args.no_store else args.sync)


def run_simulate_fleet(args) -> int:
    from minivtc.engine.engine_config import EngineConfig
    from minivtc.experiments.fleet_runs import simulate_fleet_to_dir

    refused = [
        flag
        for flag, given in [
            ("--reservation", args.reservation == "none"),
            ("--victim", args.victim),
            ("--preemption", args.preemption),
            ("--prefix-caching", args.prefix_caching),
            ("--cached-weight", args.cached_weight is not None),
            ("--block-size", args.block_size != 1),
        ]
        if given
    ]
    if refused:
        raise ValueError(
            f"{', '.join(refused)}: not with --replicas (each replica reserves prompt + "
            "max_tokens, full reservation, in a token-granular pool)"
        )
    if args.replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {args.replicas}")
    if args.dynamo_table:
        return print_dynamo_table(args)
    config = EngineConfig.of(args.scheduler, kv_tokens=args.kv_tokens, block_size=1, seed=args.seed)
    summary = simulate_fleet_to_dir(
        args.workload or args.trace,
        config,
        args.step_time,
        args.out,
        args.replicas,
        routing_of(args),
        args.route_by,
        staleness=args.staleness,
    )
    for key, value in summary.items():  # as `cli.simulate.print_summary`, then each replica
        if not isinstance(value, dict | list):
            print(f"{key:>22}: {value}")
    for row in summary["per_replica"]:
        print(f"{'replica ' + str(row['replica']):>22}: {row}")
    print(
        f"wrote {args.out}/requests.csv (with a replica column), metrics.json, service.png, gap.png"
    )
    return 0


def print_dynamo_table(args) -> int:
    from pathlib import Path

    from minivtc.experiments.fleet_runs import dynamo_table

    if args.gateways is None or args.workload != "pair":
        raise ValueError("--dynamo-table runs --workload pair with --gateways K")
    table = dynamo_table(args.replicas, args.gateways, args.sync, args.step_time)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "table.md").write_text(table + "\n")
    print(table)
    return 0
