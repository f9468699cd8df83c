"""The live dashboard: `/dashboard`, one page that draws fairness as it happens, and
`/dashboard/data`, the JSON it polls.

Owns the page's routes (`add_dashboard`), who may see them (`viewer`), what the server tells
the page (`Setup`, made once from the engine before it runs, and `server_data`, made from a
`Snapshot` at each poll) and `announce`, the line `minivtc demo --dashboard` prints. The page
itself is `dashboard.html` next to this file: plain HTML, CSS and SVG drawn by a few hundred
lines of JavaScript, nothing fetched from anywhere but the server (it works offline). Does not
own the numbers (the scheduler's counters, `engine_loop.py`'s times to first token,
`observability.py`'s views) or the gateway's view of the fleet (`gateway/app.py`, which
serves the same page). Lesson 9 opens it.

What the page draws, per client: its counter (service divided by its weight, plus its lifts:
Algorithm 2) and weight, its service rate over time (tokens/s, w_p per prompt token and w_q
per output token: the paper's Figure 3 view), its requests waiting and running, and its mean
and recent time to first token; for the server: the policy and its options, KV blocks used,
tokens/s, and for the VTC family the waiting counters' spread under its ceiling, Lemma 4.3's U
(or, with fair preemption, U_P: `cost.preemptive_bound`); for the gateway, its backends and
which gateway served what (clients x gateways: `shared_store.Served`). The page polls; the server
keeps no history for it (each page keeps its own, and computes rates from consecutive
snapshots' times), so a dashboard nobody watches costs nothing. The spread is sampled at each
poll; the engine's `check_fairness` is what asserts Lemma 4.3 after every step.

Who sees what: `/fairness`'s rules. With API keys an admin key sees everything and any other
key only its own client's row and the server's configuration, never the pool's use, the
server's throughput or the spread (each tells one tenant about the others). The page itself
holds no data, so it is served without a key (`middleware.py` lets it through) and asks for one; its
data needs the key as every route does. Without keys every caller is trusted with everyone's
usage, so the page and its data answer callers on loopback only.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse

from minivtc.engine.engine import Engine, build_fairness_check
from minivtc.engine.preemption import Fair
from minivtc.serving.api_keys import Auth, Caller
from minivtc.serving.middleware import is_loopback
from minivtc.serving.observability import fairness_view
from minivtc.serving.openai_api import APIError
from minivtc.serving.server_stats import Snapshot

__all__ = ["EVERY_S", "Setup", "add_dashboard", "announce", "dashboard_url", "on_loopback"]
__all__ += ["read_page", "server_data", "spread_bound", "spread_view", "viewer"]

PAGE = "dashboard.html"  # package data, next to this file
EVERY_S = 0.5  # how often the page polls (its `?every=` changes it)
LOOPBACK_ONLY = (
    "the dashboard shows every client's usage: without --api-keys it answers callers on "
    "loopback only (open it on this machine, or start the server with --api-keys)"
)


# The page runs its own inline script and style, asks only its own server for data, and may not
# be framed by another page (clickjacking) nor read as anything but HTML
PAGE_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; connect-src 'self'; img-src data:; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def add_dashboard(app: FastAPI, data: Callable[[Request], Awaitable[dict]]) -> None:
    """`/dashboard` (the page) and `/dashboard/data` (`data(http)`: the app's own view for
    that caller) at `app`: the server's and the gateway's."""

    async def page(http: Request) -> HTMLResponse:
        refuse_strangers(http.app.state.minivtc.auth, http)  # (with keys: open, it holds no data)
        return HTMLResponse(read_page(), headers=PAGE_HEADERS)

    app.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)(page)
    app.get("/dashboard/data", include_in_schema=False)(data)


def read_page() -> str:
    return files("minivtc.serving").joinpath(PAGE).read_text(encoding="utf-8")


def viewer(auth: Auth, http: Request) -> Caller:
    """Who is looking: the caller `/fairness` would see (an admin: everyone; a tenant: itself);
    without keys, a caller on loopback (403 for any other)."""
    refuse_strangers(auth, http)
    return auth.caller(http.headers.get("authorization"), http.headers.get("x-client-id"))


def refuse_strangers(auth: Auth, http: Request) -> None:
    """Without keys, 403 for a caller not on loopback: everyone's usage is on the page."""
    if auth.keys is None and not on_loopback(http):
        raise APIError(403, LOOPBACK_ONLY, kind="permission_error")


def on_loopback(http: Request) -> bool:
    return http.client is not None and is_loopback(http.client.host)


# --- the server's data ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """What the server is, for the page: fixed for its life, so read once, before the engine
    thread starts (handlers never touch the engine while it runs)."""

    started: float  # time.time() when the app was made: the page starts afresh on a new one
    scheduler: str
    options: dict  # the engine's options, as given and as in effect (preempt_gap)
    weights: dict[str, float]  # the operator's shares (the VTC family's; {} for others)
    bound: float | None  # the waiting counters' ceiling, in counter units (None: none stated)
    bound_name: str  # which bound, or why there is none

    @classmethod
    def of(cls, engine: Engine) -> Setup:
        options = engine.config.options() | {
            "preempt_gap": fair_gap(engine),  # (the default, once the engine chose it)
            "prefix_caching": engine.cache is not None,
            "kv_tokens": engine.allocator.num_tokens,
            "max_model_len": engine.max_model_len,
        }
        bound, name = spread_bound(engine)
        weights = engine.scheduler.ledger.client_weights()
        return cls(time.time(), engine.scheduler.name, options, weights, bound, name)


def fair_gap(engine: Engine) -> float | None:
    """The gap in effect for the fair victim (None: another victim, or no preemption)."""
    return engine.victim.gap if isinstance(engine.victim, Fair) else None


def spread_bound(engine: Engine) -> tuple[float | None, str]:
    """The ceiling the VTC family keeps the waiting counters under, as the engine's own
    check_fairness states it (`fairness_check.FairnessCheck`), or why there is none."""
    if not engine.scheduler.ledger.keeps_counters:
        return None, f"{engine.scheduler.name} keeps no counters: there is no spread to bound"
    try:
        check = engine.fairness or build_fairness_check(engine)
    except ValueError as e:  # (a predictor, the artifact's peak check, the latest victim)
        return None, str(e).removeprefix("check_fairness: ")
    if check.preempt_gap is not None:
        return check.bound, "U_P = max(gap, w_p L_input) + w_q B (fair preemption)"
    return check.bound, "U = max(w_p L_input, w_q M), w_p <= w_q (Lemma 4.3; cost.fairness_bound)"


def server_data(snap: Snapshot, setup: Setup, caller: Caller) -> dict:
    """`/dashboard/data` at the server: `/fairness`'s view for `caller` (`fairness_view`),
    each row with its times to first token, and the server's configuration; for an admin
    also the server's totals (the page's tokens/s) and the waiting counters' spread."""
    only = None if caller.admin else caller.client
    view = fairness_view(snap, only)
    for client, row in view["clients"].items():
        first = snap.first_tokens.get(client)
        row["ttft_mean"] = first.mean if first else None
        row["ttft_recent"] = first.recent_mean if first else None
    data = {
        "kind": "server",
        "started": setup.started,
        "time": snap.taken,
        "every_s": EVERY_S,
        **view,
        "options": setup.options,
    }
    if only is not None:  # a tenant: no one else's weight, totals or counters
        return data
    everyone = [*snap.clients.values(), snap.forgotten]
    return data | {
        "weights": setup.weights,
        "tokens": sum(r.input_tokens + r.output_tokens for r in everyone),
        "fairness": spread_view(view["clients"], setup.bound, setup.bound_name),
    }


def spread_view(clients: dict[str, dict], bound: float | None, bound_name: str) -> dict:
    """The waiting counters' spread (max - min over the clients with a request waiting: the
    left side of Lemma 4.3) beside its ceiling; no spread where no bound is stated."""
    waiting = [row["counter"] for row in clients.values() if row["waiting"]]
    waiting = [c for c in waiting if c is not None]
    spread = max(waiting) - min(waiting) if waiting and bound is not None else None
    return {"spread": spread, "bound": bound, "bound_name": bound_name}


# --- minivtc demo --dashboard -------------------------------------------------------------------


def dashboard_url(port: int, host: str = "127.0.0.1") -> str:
    """The server's root on `port`, once it is known to be free: the demo's runs take turns
    there, so the page stays at one address. A ValueError (a clear refusal) if it is taken."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as `BackgroundServer` binds)
        try:
            s.bind((host, port))
        except OSError as e:
            raise ValueError(
                f"--dashboard: cannot serve on {host}:{port} ({e.strerror}); give another port, "
                "e.g. --dashboard 8123"
            ) from None
    return f"http://{host}:{port}"


def announce(url: str) -> str:
    """What `minivtc demo --dashboard` prints before its runs."""
    return (
        f"watch it live: open {url}/dashboard in a browser on this machine. Each run (FCFS, "
        "then VTC) serves there in turn; the page starts afresh when the next one begins"
    )
