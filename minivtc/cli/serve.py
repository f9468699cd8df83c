"""`minivtc serve`: its flags (minivtc's, and vLLM's: `vllm_flags.py`) and starting the server.

Owns parsing the serve command's arguments into the engine, the keys and the app's options,
`port` (the argparse type the client commands share); the allocator it starts on is
`serving/allocator.py`'s. Terminal output only; the server is `server.py`'s. Lesson 9.
"""

from __future__ import annotations

import argparse
import os
import sys

from minivtc.cli.simulate import add_memory_options, add_prefix_options, config_of

__all__ = [
    "add_connection_flags",
    "add_serve",
    "bind_threads",
    "limits_of",
    "port",
    "warn_if_public",
]

BINDING = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")


def bind_threads() -> None:
    """Before torch loads: each of the engine's OpenMP threads on a core of its own
    (`OMP_PROC_BIND=true`), unless the user said where they go, as vLLM's CPU backend binds
    its own. Why: between steps the threads sleep; woken, the scheduler may put two of them on
    one core, and at each of a product's barriers the one that spins waits out the other's
    time slice, so a freshly started server stepped slowly until a long run of steps had
    spread them (minivtc/bench/README.md has the measurements)."""
    if not any(name in os.environ for name in BINDING):
        os.environ["OMP_PROC_BIND"] = "true"


def add_serve(sub) -> None:
    from minivtc.fairness.policies import SCHEDULERS
    from minivtc.serving.vllm_flags import add_vllm_flags

    p = sub.add_parser(
        "serve",
        allow_abbrev=False,  # vLLM's --api-key must never pass for --api-keys
        help="an OpenAI-compatible server with fair scheduling",
        description="Serve /v1/completions and /v1/chat/completions (streaming or not), "
        "/v1/models, /health, /metrics (Prometheus), /fairness (each client's counter, "
        "weight, queue and service) and /dashboard, a live page of the same in a browser "
        "(without --api-keys, for callers on this machine only). Without --api-keys the "
        "client is the X-Client-Id header, else the body's 'user', else 'default' (for local "
        "use: anyone can claim any client). With --api-keys, callers send 'Authorization: "
        "Bearer KEY' and are the key's client.",
    )
    p.add_argument(
        "--weights", default=None, help="Hugging Face Llama directory (default: bundled)"
    )
    p.add_argument("--scheduler", default="vtc", help=f"policy: {SCHEDULERS} (default vtc)")
    p.add_argument(
        "--client-weights",
        default=None,
        help='JSON file of per-client shares for the VTC family, e.g. {"alice": 2, "bob": 1}',
    )
    p.add_argument(
        "--kv-tokens",
        type=int,
        default=None,
        help="KV pool in tokens, at least one block of 16 (default 10000)",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        help="the weights' dtype: auto (the checkpoint's; fp16 runs as fp32 on a CPU), fp32, "
        "bf16, fp16, or vLLM's names (float32, bfloat16, float16, half)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=8000, help="port, 1-65535 (default 8000)")
    p.add_argument(
        "--api-keys",
        default=None,
        metavar="FILE",
        help='JSON file of API key -> client, e.g. {"sk-alice": {"client": "alice", "weight": 2}, '
        '"sk-ops": {"client": "ops", "admin": true}}; admin keys may read /metrics and every '
        "row of /fairness",
    )
    p.add_argument(
        "--trust-client-header",
        action="store_true",
        help="without --api-keys only (where every caller names its client anyway): take the "
        "client from X-Client-Id / 'user'. With --api-keys trust is a key's: mark a trusted "
        'proxy\'s key with "proxy": true in the keys file',
    )
    add_connection_flags(p)
    add_memory_options(p, default="full")
    add_prefix_options(p)
    add_vllm_flags(p)
    p.set_defaults(run=run_serve)


def run_serve(args) -> int:
    import json
    from dataclasses import replace
    from pathlib import Path

    import torch

    from minivtc.engine.factory import build_engine, compile_shapes
    from minivtc.model.packed import packs_on
    from minivtc.model.weights import load_model
    from minivtc.serving.allocator import describe
    from minivtc.serving.api_keys import Auth, read_keys, weights_of
    from minivtc.serving.server import Server
    from minivtc.serving.vllm_flags import VLLMServe

    limits = limits_of(args)
    vllm = VLLMServe.of(args)
    args.prefix_caching = args.prefix_caching or args.enable_prefix_caching
    if args.api_keys and args.client_weights:
        raise ValueError("give weights in the --api-keys file, not also --client-weights")
    if args.trust_client_header and args.api_keys:
        raise ValueError(
            "--trust-client-header would let every key name any client: mark the trusted "
            'proxy\'s key with "proxy": true in the --api-keys file instead'
        )
    keys = read_keys(args.api_keys) if args.api_keys else vllm.keys
    weights = weights_of(keys) if keys else None
    if args.client_weights:
        try:
            weights = json.loads(Path(args.client_weights).read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{args.client_weights}: not valid JSON ({e})") from None
        if not isinstance(weights, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")
            for v in weights.values()
        ):
            raise ValueError(
                f"{args.client_weights}: want an object of client -> weight > 0 (finite)"
            )
    batch = {} if args.max_num_seqs is None else {"max_running": args.max_num_seqs}
    config = config_of(args, weights=weights, **batch)  # (refused before the model loads)
    dtype = vllm.dtype(args)  # ("auto" and vLLM's names: `weights.resolve_dtype`)
    # on a CPU: the forward pass compiled whole (model/compiled.py), as vLLM compiles by
    # default, or with --enforce-eager run eagerly on oneDNN's packed products (model/packed.py)
    fast = packs_on(args.device, dtype)
    compiled, packed = fast and not args.enforce_eager, fast and args.enforce_eager
    model, tokenizer = load_model(vllm.checkpoint, dtype, args.device, packed, compiled)
    engine = build_engine(model, tokenizer, replace(config, **vllm.pool(args, model)))
    if compiled:  # before the port opens (after the options' and the pool's refusals)
        print("compiling the model's forward pass (--enforce-eager: not)...", file=sys.stderr)
        compile_shapes(model)
    name = vllm.name
    root = f"http://{args.host}:{args.port}"
    print(
        f"serving {name} with {args.scheduler} on {root}/v1 (watch it live: {root}/dashboard)",
        file=sys.stderr,
    )
    print(f"allocator: {describe(os.environ)}", file=sys.stderr)
    binding = ", ".join(f"{n}={os.environ[n]}" for n in BINDING if n in os.environ) or "unbound"
    print(f"engine threads: {torch.get_num_threads()} ({binding})", file=sys.stderr)
    warn_if_public(args.host, keys is not None, "serving")
    auth = Auth(keys)
    server = Server(
        engine,
        tokenizer,
        name,
        args.host,
        args.port,
        args.shutdown_timeout,
        auth=auth,
        limits=limits,
        aliases=vllm.aliases,
        chat_template=args.chat_template,
    )
    return server.run()


def add_connection_flags(p) -> None:
    """What one connection and one client may cost, and the shutdown's time limit: `serve`'s
    and `route`'s flags alike (`limits_of` reads them)."""
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=4 * 1024 * 1024,
        help="larger request bodies get 413 before parsing (default 4 MiB)",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds a connection has to send a request's line and headers, from when it "
        "opens or its last response ends; then it is closed (default 10)",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds a request has to send its whole body once its headers are in; then "
        "it gets 408 (default 30)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=1024,
        metavar="N",
        help="connections open at once, streams included (uvicorn's limit_concurrency): "
        "a request beyond them gets 503 (default 1024, far above one client's share)",
    )
    p.add_argument(
        "--max-client-requests",
        type=int,
        default=64,
        metavar="N",
        help="requests one client may have queued or running at once (each of n "
        "completions counts); its requests beyond them get 429 while every other client "
        "is still admitted (default 64)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds in-flight requests get to finish after SIGTERM/SIGINT; then they "
        "end with an error and the server exits (default 30)",
    )


def limits_of(args):
    """`add_connection_flags`' flags as the server's `Limits` (checked there)."""
    from minivtc.serving.connections import Limits

    if not 0 <= args.shutdown_timeout < float("inf"):
        raise ValueError(f"--shutdown-timeout must be seconds >= 0, not {args.shutdown_timeout}")
    return Limits(
        args.max_body_bytes,
        args.header_timeout,
        args.body_timeout,
        args.max_connections,
        args.max_client_requests,
    )


def warn_if_public(host: str, keyed: bool, what: str) -> None:
    """Bound to an address others can reach, without keys: say what that gives away."""
    if not keyed and host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"WARNING: {what} {host} without --api-keys: any caller can claim to be "
            "any client (and take its share) and can read every client's usage",
            file=sys.stderr,
        )


def port(text: str) -> int:
    """argparse type: a TCP port number."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a number from 1 to 65535, not {text!r}")
    return int(text)
