"""`/dashboard` and `/dashboard/data` (`serving/dashboard.py`): what the page is told, the bound
it draws (the engine's own check_fairness's), per-client times to first token, who may see
what (`/fairness`'s rules; without keys, loopback only), at the server and at the gateway. The
page in a real browser: `test_dashboard_browser.py`."""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from fastapi import Request
from fastapi.testclient import TestClient

from minivtc.engine.factory import build_engine
from minivtc.fairness.cost import W_P, W_Q
from minivtc.fairness.vtc import VTC
from minivtc.fleet.backend import Backend
from minivtc.gateway.app import make_gateway
from minivtc.gateway.gateway import Gateway
from minivtc.model.tokenizer import Tokenizer
from minivtc.model.weights import bundled_weights_dir
from minivtc.serving.api_keys import Auth, Caller, Key, weights_of
from minivtc.serving.dashboard import Setup, on_loopback, read_page, server_data
from minivtc.serving.engine_loop import EngineLoop
from minivtc.serving.hosting import BackgroundServer
from minivtc.serving.observability import fairness_view
from minivtc.serving.server import make_app
from minivtc.serving.server_stats import ClientRow, FirstTokens, Snapshot

KEYS = {
    "sk-alice-1": Key("alice", 2.0),
    "sk-bob-123": Key("bob"),
    "sk-ops-123": Key("ops", admin=True),
}


def engine_of(bundled, scheduler="vtc", kv_tokens=512, **options):
    model, tokenizer = bundled
    return build_engine(model, tokenizer, scheduler, kv_tokens=kv_tokens, **options)


# --- the bound and the configuration ----------------------------------------------------------


@pytest.mark.parametrize(
    "scheduler, options",
    [
        ("vtc", {}),
        ("vtc", {"reservation": "none", "victim": "fair", "preempt_gap": 300.0}),
        ("lcf", {}),  # (LCF breaks Lemma 4.3: the page shows its spread crossing the line)
    ],
)
def test_the_ceiling_is_the_one_check_fairness_asserts(bundled, scheduler, options):
    weights = {"alice": 2.0, "bob": 0.5}
    checked = engine_of(bundled, scheduler, weights=weights, check_fairness=True, **options)
    plain = engine_of(bundled, scheduler, weights=weights, **options)
    assert checked.fairness is not None
    assert Setup.of(plain).bound == Setup.of(checked).bound == checked.fairness.bound
    if "victim" in options:
        assert "U_P" in Setup.of(plain).bound_name
        assert Setup.of(plain).options["preempt_gap"] == 300.0  # (the gap in effect)
    else:  # Lemma 4.3's U, in counter units: divided by the smallest weight below 1
        pool, longest = plain.allocator.num_tokens, plain.max_model_len - 1
        assert Setup.of(plain).bound == max(W_P * longest, W_Q * pool) / 0.5


@pytest.mark.parametrize(
    "scheduler, options, why",
    [
        ("fcfs", {}, "fcfs keeps no counters"),
        ("drr", {}, "drr:256 keeps no counters"),
        ("vtc", {"reservation": "peak"}, "peak check"),
        ("vtc-predict", {}, "length predictor"),
    ],
)
def test_no_ceiling_where_no_bound_is_stated_and_the_page_says_why(
    bundled, scheduler, options, why
):
    setup = Setup.of(engine_of(bundled, scheduler, **options))
    assert setup.bound is None and why in setup.bound_name


def test_setup_holds_the_policy_options_and_weights(bundled):
    engine = engine_of(bundled, "vtc", weights={"alice": 2.0}, max_running=8)
    setup = Setup.of(engine)
    assert setup.scheduler == "vtc" and setup.weights == {"alice": 2.0}
    assert setup.options["max_running"] == 8 and setup.options["reservation"] == "full"
    assert setup.options["kv_tokens"] == 512 and setup.options["prefix_caching"] is False


# --- the data, from a snapshot ----------------------------------------------------------------


def snapshot() -> Snapshot:
    rows = {
        "alice": ClientRow(300.0, 2.0, waiting=2, running=1, input_tokens=40, output_tokens=100),
        "bob": ClientRow(120.0, 1.0, waiting=1, running=2, input_tokens=20, output_tokens=50),
        "carol": ClientRow(900.0, 1.0, waiting=0, running=1, input_tokens=5, output_tokens=10),
    }
    first = {"alice": FirstTokens(), "bob": FirstTokens()}
    for t in (0.1, 0.2, 0.6):
        first["alice"].observe(t)
    for t in [1.0] * 12 + [3.0] * 10:  # the last 10 (RECENT_FIRST_TOKENS) are all 3 s
        first["bob"].observe(t)
    forgotten = ClientRow(None, 1.0, 0, 0, 7, 3)
    return Snapshot("vtc", rows, 9, 32, 16, {}, forgotten=forgotten, first_tokens=first, taken=5.0)


def test_an_admin_sees_every_client_the_totals_and_the_spread():
    setup = Setup(1.0, "vtc", {"reservation": "full"}, {"alice": 2.0}, 2048.0, "U")
    data = server_data(snapshot(), setup, Caller("ops", admin=True))
    assert set(data["clients"]) == {"alice", "bob", "carol"}
    assert data["kv"]["used_blocks"] == 9 and data["time"] == 5.0 and data["started"] == 1.0
    assert data["tokens"] == 40 + 100 + 20 + 50 + 5 + 10 + 7 + 3  # the forgotten clients' too
    # carol runs but waits for nothing: the spread is over waiting clients only (Lemma 4.3)
    assert data["fairness"] == {"spread": 300.0 - 120.0, "bound": 2048.0, "bound_name": "U"}
    alice, bob = data["clients"]["alice"], data["clients"]["bob"]
    assert alice["ttft_mean"] == pytest.approx(0.3) == alice["ttft_recent"]
    assert bob["ttft_mean"] == pytest.approx((12 + 30) / 22) and bob["ttft_recent"] == 3.0
    assert data["clients"]["carol"]["ttft_mean"] is None  # nothing finished yet
    assert data["weights"] == {"alice": 2.0} and data["options"] == {"reservation": "full"}


def test_a_tenant_sees_what_fairness_shows_it_and_its_own_first_tokens():
    setup = Setup(1.0, "vtc", {"reservation": "full"}, {"alice": 2.0}, 2048.0, "U")
    snap = snapshot()
    data = server_data(snap, setup, Caller("bob", admin=False))
    fairness = fairness_view(snap, "bob")
    bob = {k: v for k, v in data["clients"]["bob"].items() if not k.startswith("ttft_")}
    assert {k: data[k] for k in fairness} | {"clients": {"bob": bob}} == {
        "scheduler": "vtc",
        "kv": fairness["kv"],  # the pool's size, not its use
        "clients": {"bob": fairness["clients"]["bob"]},
    }
    assert "used_blocks" not in data["kv"] and data["clients"]["bob"]["ttft_recent"] == 3.0
    for told_of_others in ("tokens", "fairness", "weights"):
        assert told_of_others not in data


def test_no_spread_without_a_bound_or_with_nobody_waiting():
    snap = snapshot()
    fcfs = Setup(1.0, "fcfs", {}, {}, None, "fcfs keeps no counters")
    assert server_data(snap, fcfs, Caller("ops", True))["fairness"]["spread"] is None
    for row in snap.clients.values():
        row.waiting = 0
    vtc = Setup(1.0, "vtc", {}, {}, 2048.0, "U")
    assert server_data(snap, vtc, Caller("ops", True))["fairness"]["spread"] is None


# --- the engine loop's first tokens -----------------------------------------------------------


def test_first_tokens_per_client_add_up_to_the_servers_histogram(bundled):
    engine = engine_of(bundled, "vtc")
    app = make_app(engine, bundled[1], forget_every_s=3600)
    with BackgroundServer(app) as url:
        for client, n in (("alice", 3), ("bob", 2)):
            for _ in range(n):
                body = {"prompt": "Hello there", "max_tokens": 4}
                answer = httpx.post(
                    url + "/v1/completions", json=body, headers={"x-client-id": client}
                )
                assert answer.status_code == 200
        snap = snapshot_of(app.state.minivtc.loop)
    assert {c: f.count for c, f in snap.first_tokens.items()} == {"alice": 3, "bob": 2}
    assert sum(f.total for f in snap.first_tokens.values()) == pytest.approx(snap.ttft_sum)


def test_forgotten_clients_first_tokens_go_and_a_tenants_stay(bundled):
    keys = {"sk-alice-1": Key("alice"), "sk-proxy-1": Key("proxy", proxy=True)}
    app = make_app(engine_of(bundled, "fcfs"), bundled[1], auth=Auth(keys), forget_every_s=3600)
    with BackgroundServer(app) as url:
        for key, client in (("sk-alice-1", None), ("sk-proxy-1", "eve")):
            headers = {"authorization": f"Bearer {key}"} | (
                {"x-client-id": client} if client else {}
            )
            body = {"prompt": "Hello", "max_tokens": 2}
            assert (
                httpx.post(url + "/v1/completions", json=body, headers=headers).status_code == 200
            )
        loop = app.state.minivtc.loop
        assert set(snapshot_of(loop).first_tokens) == {"alice", "eve"}
        assert sorted(loop.send(loop.forget_idle_clients).result(timeout=10)) == ["alice", "eve"]
        assert set(snapshot_of(loop).first_tokens) == {"alice"}  # eve's went with her row


def snapshot_of(loop: EngineLoop) -> Snapshot:
    future = loop.send(loop.snapshot)
    return future.result(timeout=10)


# --- who may see what -------------------------------------------------------------------------


def test_without_keys_loopback_callers_only(bundled):
    app = make_app(engine_of(bundled, "vtc"), bundled[1])
    with TestClient(app) as stranger:  # the test client's host: "testclient", not loopback
        for path in ("/dashboard", "/dashboard/data"):
            answer = stranger.get(path)
            assert answer.status_code == 403
            assert "loopback only" in answer.json()["error"]["message"]
        for path in ("/fairness", "/metrics"):  # (the same rule as the dashboard)
            assert stranger.get(path).status_code == 403, path
    app = make_app(engine_of(bundled, "vtc"), bundled[1])  # (an app's engine runs once)
    local_client = TestClient(app, base_url="http://localhost", client=("127.0.0.1", 40000))
    with local_client as local:
        assert local.get("/dashboard").status_code == 200
        assert local.get("/dashboard/data").json()["kind"] == "server"


@pytest.mark.parametrize(
    "address, local",
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),  # (IPv4 on a dual-stack socket)
        ("10.0.0.5", False),
        ("::ffff:10.0.0.5", False),
        ("2001:db8::1", False),
        ("testclient", False),
    ],
)
def test_loopback_is_an_address_on_the_loopback_network(address, local):
    assert on_loopback(Request({"type": "http", "client": (address, 40000)})) is local


def test_with_keys_the_page_is_open_and_its_data_follows_fairness(bundled):
    engine = engine_of(bundled, "vtc", weights=weights_of(KEYS))  # (as `serve` builds it)
    app = make_app(engine, bundled[1], auth=Auth(KEYS))
    with TestClient(app) as http:  # (not loopback: with keys, the key decides)
        page = http.get("/dashboard")
        assert page.status_code == 200 and "<svg" in page.text  # holds no data: no key needed
        assert http.get("/dashboard/data").json()["error"]["code"] == "missing_api_key"
        for key in KEYS:  # every tenant has a row (tenants are never forgotten)
            auth = {"authorization": f"Bearer {key}"}
            body = {"prompt": "Hi", "max_tokens": 2}
            assert http.post("/v1/completions", json=body, headers=auth).status_code == 200
        for key, who in (("sk-bob-123", "bob"), ("sk-ops-123", None)):
            auth = {"authorization": f"Bearer {key}"}
            data = http.get("/dashboard/data", headers=auth).json()
            fairness = http.get("/fairness", headers=auth).json()
            assert set(data["clients"]) == set(fairness["clients"])
            assert set(data["clients"]) == ({who} if who else {"alice", "bob", "ops"})
            assert ("fairness" in data) == (who is None) == ("used_blocks" in data["kv"])
        admin = http.get("/dashboard/data", headers={"authorization": "Bearer sk-ops-123"})
        assert admin.json()["weights"] == {"alice": 2.0, "bob": 1.0, "ops": 1.0}


def test_the_gateways_page_shows_the_fleet_to_an_admin_only():
    tokenizer = Tokenizer(bundled_weights_dir() / "tokenizer.model")
    backends = [Backend("http://127.0.0.1:9", 256), Backend("http://127.0.0.1:10", 512)]
    gateway = Gateway(VTC(), backends, tokenizer, "minivtc-tiny", Auth(KEYS))
    gateway.gateway_id = "gw-a"  # (`minivtc route`: host:port)
    gateway.served.record("alice", 4, 6)  # (as `end` records a request served)
    gateway.served.record("bob", 2, 3)
    with TestClient(make_gateway(gateway)) as http:
        assert http.get("/dashboard").status_code == 200
        admin = http.get("/dashboard/data", headers={"authorization": "Bearer sk-ops-123"})
        data = admin.json()
        assert data["kind"] == "gateway" and [b["budget"] for b in data["backends"]] == [256, 512]
        assert data["fairness"]["bound"] == gateway.dispatcher.fairness.bound == 2 * (256 + 512)
        assert set(data["requests"]) == {"served", "given_back", "broken"}
        alice = {"requests": 1, "input_tokens": 4, "output_tokens": 6}
        bob = {"requests": 1, "input_tokens": 2, "output_tokens": 3}
        assert data["gateway"] == "gw-a" and data["served"] == {
            "gw-a": {"alice": alice, "bob": bob}
        }
        tenant = http.get("/dashboard/data", headers={"authorization": "Bearer sk-bob-123"})
        assert "backends" not in tenant.json() and "fairness" not in tenant.json()
        assert tenant.json()["served"] == {"gw-a": {"bob": bob}}
    open_gateway = Gateway(VTC(), [Backend("http://127.0.0.1:9", 256)], tokenizer, "m", Auth())
    with TestClient(make_gateway(open_gateway)) as stranger:
        assert stranger.get("/dashboard/data").status_code == 403


# --- the page ---------------------------------------------------------------------------------


def test_the_page_fetches_nothing_but_its_data_and_writes_names_as_text():
    page = read_page()
    addresses = set(re.findall(r"https?://[^\s\"'<>)]+", page))
    assert addresses == {"http://www.w3.org/2000/svg"}  # (SVG's namespace, not a fetch)
    assert "<script src" not in page and '<link rel="stylesheet"' not in page
    # a client id is whatever a caller sent: never parsed as HTML
    for unsafe in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write"):
        assert unsafe not in page


def test_the_page_is_package_data():
    from importlib.resources import files

    assert files("minivtc.serving").joinpath("dashboard.html").is_file()
    tomllib = pytest.importorskip("tomllib", reason="Python >= 3.11 reads TOML")
    with open(Path(__file__).parent.parent / "pyproject.toml", "rb") as f:
        data = tomllib.load(f)["tool"]["setuptools"]["package-data"]["minivtc"]
    assert "serving/*.html" in data


def test_the_data_changes_while_requests_run(bundled):
    app = make_app(engine_of(bundled, "vtc"), bundled[1])
    with BackgroundServer(app) as url:
        before = httpx.get(url + "/dashboard/data").json()
        body = {"prompt": "Once upon a time", "max_tokens": 8}
        httpx.post(url + "/v1/completions", json=body, headers={"x-client-id": "alice"})
        time.sleep(0.01)
        after = httpx.get(url + "/dashboard/data").json()
    assert after["time"] > before["time"] and after["tokens"] > before["tokens"] == 0
    assert after["clients"]["alice"]["service"] > 0 and after["started"] == before["started"]


# --- minivtc demo --dashboard -----------------------------------------------------------------


def test_demo_dashboard_refuses_a_taken_port_before_loading_anything(tmp_path, capsys):
    from minivtc.cli.main import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["demo", "--dashboard", str(port), "--out", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert f"minivtc demo: error: --dashboard: cannot serve on 127.0.0.1:{port}" in error


@pytest.mark.slow
def test_each_demo_run_serves_its_dashboard_at_the_same_address(bundled):
    from minivtc.serving import demo
    from minivtc.serving.dashboard import dashboard_url
    from minivtc.sim.workloads import TraceRequest

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = dashboard_url(port)
    seen: set[tuple[str, float]] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                data = httpx.get(url + "/dashboard/data", timeout=1).json()
                seen.add((data["scheduler"], data["started"]))
            except httpx.HTTPError:  # between two runs: nobody serves
                pass
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    trace = [TraceRequest(c, k * 0.1, 8, 8) for k in range(10) for c in ("heavy", "light")]
    try:
        for scheduler in ("fcfs", "vtc"):
            setup = demo.ServerSetup(port=port)
            result = demo.serve_once(*bundled, scheduler, trace, 5.0, progress=False, setup=setup)
            assert len(result.served) == len(trace)
    finally:
        done.set()
        watcher.join()
    assert sorted({name for name, _ in seen}) == ["fcfs", "vtc"]
    assert len({started for _, started in seen}) == 2  # the page starts afresh for the second
