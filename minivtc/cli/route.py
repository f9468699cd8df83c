"""`minivtc route`: the gateway's command line (`gateway.py`, `gateway/app.py`).

Owns its flags and starting it: reading each backend's budget (`--backend URL=TOKENS`, or for
a minivtc backend its `/fairness`: the KV pool's blocks times the block size), the API keys
(the server's own file format), and uvicorn in the foreground, which on SIGTERM or SIGINT stops
accepting connections and lets in-flight and waiting requests finish (up to
`--shutdown-timeout`). minivtc/fleet/README.md; Lesson 11.
"""

from __future__ import annotations


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
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--shutdown-timeout", type=float, default=30.0, metavar="S")
    p.set_defaults(run=run_route)


def run_route(args) -> int:
    import uvicorn

    from minivtc.fairness.policies import make_scheduler
    from minivtc.gateway.app import make_gateway
    from minivtc.gateway.gateway import Gateway
    from minivtc.gateway.launch import backends_of
    from minivtc.model.tokenizer import Tokenizer
    from minivtc.model.weights import bundled_weights_dir
    from minivtc.serving.api_keys import Gate, read_keys, weights_of

    keys = read_keys(args.api_keys) if args.api_keys else None
    weights = weights_of(keys) if keys else None
    root = args.tokenizer or bundled_weights_dir()
    tokenizer = Tokenizer(f"{root}/tokenizer.model")
    gateway = Gateway(
        make_scheduler(args.scheduler, weights=weights),
        backends_of(args.backend),
        tokenizer,
        args.model,
        Gate(keys),
    )
    app = make_gateway(gateway)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        timeout_graceful_shutdown=int(args.shutdown_timeout),
    )
    return 0
