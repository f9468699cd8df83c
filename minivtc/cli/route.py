"""`minivtc route`: the gateway's command line (`gateway.py`, `gateway/app.py`).

Owns its flags and starting it: reading each backend's budget (`--backend URL=TOKENS`, or for
a minivtc backend its `/fairness`: the KV pool's blocks times the block size), the API keys
(the server's own file format), the key it presents to its backends, the connection limits and
flags `serve` has (`cli/serve.add_connection_flags`), and uvicorn in the foreground, which on
SIGTERM or SIGINT stops accepting connections and lets in-flight and waiting requests finish;
after `--shutdown-timeout` the rest end with an OpenAI error event (or a 503). With `--store`,
one of k gateways sharing the fleet (`fleet/fleet_member.py`, `fleet/redis_store.py`).
minivtc/fleet/README.md; Lesson 14.
"""

from __future__ import annotations

import os
import sys

from minivtc.cli.serve import add_connection_flags, limits_of, port, warn_if_public

__all__ = ["add_route"]

BACKEND_IDLE_S = 600.0  # (gateway.BACKEND_IDLE_S: here too, so `--help` imports nothing)
SYNC_S = 0.05  # tau: a store's round trip on a LAN is well under a millisecond
LEASE_S = 10.0


def add_route(sub) -> None:
    from minivtc.fairness.policies import SCHEDULERS

    p = sub.add_parser(
        "route",
        help="a fair gateway in front of OpenAI-compatible backends (minivtc serve, vLLM)",
        description="Hold every tenant's queue and counter in one dispatcher in front of the "
        "backends, and bind a request to a backend only when it has room (prompt + max_tokens "
        "within its budget): the backends never queue, so the dispatcher's order is the only "
        "order, and the bound is Lemma 4.3's with M the sum of the budgets. Serves "
        "/v1/completions and /v1/chat/completions (streaming or not), /health, /fairness, "
        "/metrics and /dashboard (a live page in a browser) for the whole fleet.",
    )
    p.add_argument(
        "--backend",
        action="append",
        required=True,
        metavar="URL[=TOKENS]",
        help="a backend's base URL, e.g. http://10.0.0.5:8000, and its budget in tokens "
        "(default: read from a minivtc backend's /fairness); repeat for each backend. For vLLM "
        "give the budget, and start it with --max-num-seqs and a KV cache no smaller",
    )
    p.add_argument("--scheduler", default="vtc", help=f"policy: {SCHEDULERS} (default vtc)")
    p.add_argument("--model", default="minivtc-tiny", help="the model name the fleet serves")
    p.add_argument(
        "--tokenizer",
        default=None,
        metavar="DIR",
        help="where tokenizer.model is, to count prompts (default: the bundled model's); the "
        "backend's usage corrects the count",
    )
    p.add_argument("--api-keys", default=None, metavar="FILE", help="as minivtc serve's")
    p.add_argument(
        "--backend-api-key",
        default=os.environ.get("MINIVTC_BACKEND_API_KEY"),
        metavar="KEY",
        help="the key the gateway presents to its backends (a proxy key of their keys file, "
        "or their --api-key), so that the backends need not run keyless; default the "
        "MINIVTC_BACKEND_API_KEY environment variable, which `ps` does not show",
    )
    p.add_argument(
        "--backend-timeout",
        type=float,
        default=BACKEND_IDLE_S,
        metavar="S",
        help=f"seconds a backend may send nothing before its request fails with a 502 and "
        f"its room is freed (a non-streamed answer comes whole: its longest time; default "
        f"{BACKEND_IDLE_S:g})",
    )
    add_store_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=8100, help="port, 1-65535 (default 8100)")
    add_connection_flags(p)
    p.set_defaults(run=run_route)


def add_store_flags(p) -> None:
    """--store, --store-prefix, --sync, --lease: k gateways sharing one fleet."""
    p.add_argument(
        "--store",
        default=os.environ.get("MINIVTC_STORE"),
        metavar="URL",
        help="redis://[:password@]host:port/db, a Redis or Valkey server shared with the other "
        "gateways in front of the same backends: every client's counter and every backend's "
        "room are the fleet's (minivtc/fleet/README.md); default the MINIVTC_STORE environment "
        "variable, which `ps` does not show; none: this gateway alone",
    )
    p.add_argument(
        "--store-prefix",
        default="minivtc",
        metavar="NAME",
        help="the store's keys start with it: two fleets can share one store (default minivtc)",
    )
    p.add_argument(
        "--sync",
        type=float,
        default=SYNC_S,
        metavar="TAU",
        help=f"with --store: seconds between syncs, the most another gateway's charges are "
        f"seen late (the bound's Delta grows with it; default {SYNC_S:g})",
    )
    p.add_argument(
        "--lease",
        type=float,
        default=LEASE_S,
        metavar="S",
        help=f"with --store: a dead gateway's bookings are freed after this long "
        f"(default {LEASE_S:g})",
    )


def gateway_id_of(port: int) -> str:
    """The gateway's id in `/fairness`'s `served` and `/metrics`' `gateway` label: the same
    after a restart (a restart adds to its row, not a row of its own)."""
    import socket

    return f"{socket.gethostname()}:{port}"


def member_of(args, scheduler, backends, port: int):
    """With --store: this gateway's membership of the fleet, the store checked (ValueError
    if malformed, unreachable or refusing the password); else None."""
    if args.store is None:
        return None
    import uuid

    from minivtc.fleet.fleet_member import Member
    from minivtc.fleet.redis_store import RedisStore, parse_store_url
    from minivtc.fleet.shared_store import PolicyBooks

    if not 0 <= args.sync <= 60 or not 3 * args.sync < args.lease < float("inf"):
        raise ValueError(
            f"--sync {args.sync} and --lease {args.lease}: 0 <= sync <= 60, and "
            "the lease longer than three syncs (it is renewed at each)"
        )
    store = RedisStore(parse_store_url(args.store), args.store_prefix, args.lease)
    store.check()
    gateway_id = gateway_id_of(port)
    name = f"{gateway_id}:{uuid.uuid4().hex[:6]}"  # (unique: a restart too)
    books = PolicyBooks(scheduler)
    return Member(name, store, books, backends, args.sync, gateway_id=gateway_id)


def run_route(args) -> int:
    from minivtc.fairness.policies import make_scheduler
    from minivtc.gateway.app import make_gateway
    from minivtc.gateway.gateway import Gateway
    from minivtc.gateway.proxy import backends_of
    from minivtc.model.tokenizer import Tokenizer
    from minivtc.model.weights import bundled_weights_dir
    from minivtc.serving.api_keys import MIN_KEY_CHARS, Auth, read_keys, weights_of
    from minivtc.serving.hosting import Foreground

    limits = limits_of(args)
    if not 0 < args.backend_timeout < float("inf"):
        raise ValueError(f"--backend-timeout must be seconds > 0, not {args.backend_timeout}")
    key = args.backend_api_key
    if key is not None and len(key) < MIN_KEY_CHARS:
        raise ValueError(f"--backend-api-key is shorter than {MIN_KEY_CHARS} characters")
    backend_headers = {"authorization": f"Bearer {key}"} if key else {}
    keys = read_keys(args.api_keys) if args.api_keys else None
    weights = weights_of(keys) if keys else None
    root = args.tokenizer or bundled_weights_dir()
    tokenizer = Tokenizer(f"{root}/tokenizer.model")
    scheduler = make_scheduler(args.scheduler, weights=weights)
    backends = backends_of(args.backend, backend_headers)
    member = member_of(args, scheduler, backends, args.port)
    gateway = Gateway(scheduler, backends, tokenizer, args.model, Auth(keys), member=member)
    gateway.backend_idle_s, gateway.backend_headers = args.backend_timeout, backend_headers
    gateway.gateway_id = gateway_id_of(args.port)  # (with --store, the member's already)
    app = make_gateway(gateway, limits)
    print(f"routing {args.model} on http://{args.host}:{args.port}/v1", file=sys.stderr)
    warn_if_public(args.host, keys is not None, "routing")

    def give_up() -> None:  # (on the timer's thread: the gateway lives on its event loop)
        reason = f"the gateway shut down ({args.shutdown_timeout:g} s limit)"
        if gateway.loop is not None:
            gateway.loop.call_soon_threadsafe(gateway.fail_all, reason)

    Foreground(app, args.host, args.port, args.shutdown_timeout, give_up).run()
    return 0
