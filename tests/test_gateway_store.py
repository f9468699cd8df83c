"""Several `minivtc route` gateways sharing a Redis store (`--store`) in front of the same
stand-in backends, on loopback: one client's counter is the fleet's whichever gateway charged
it, a backend's room is never booked twice, a 4:1 weighted pair holds across two gateways
with skewed ingress (and collapses without the store), a dead gateway's bookings expire, a dead
store is said in /health and /metrics, and a bad --store is a clear error at start."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from minivtc.cli.main import main
from minivtc.fairness.vtc import VTC
from minivtc.fleet.backend import Backend
from minivtc.fleet.fleet_member import Member
from minivtc.fleet.redis_store import RedisStore, parse_store_url
from minivtc.fleet.shared_store import MemoryStore, PolicyBooks
from minivtc.gateway.app import make_gateway
from minivtc.gateway.gateway import Gateway
from minivtc.model.tokenizer import Tokenizer
from minivtc.model.weights import bundled_weights_dir
from minivtc.serving.api_keys import Auth, Key, weights_of
from minivtc.serving.connections import Limits
from minivtc.serving.hosting import BackgroundServer
from tests.test_gateway import healthy

KEYS = {
    "sk-w4-tenant": Key("w4", weight=4.0),
    "sk-w1-tenant": Key("w1", weight=1.0),
    "sk-ops-admin": Key("ops", admin=True),
}
ADMIN = {"authorization": "Bearer sk-ops-admin"}
CHUNKS, CHUNK_S = 4, 0.05  # a stand-in's answer: 4 one-token chunks, 50 ms apart
NEED = 4 + CHUNKS  # tokens a request books: its prompt ("Hi there" is 4 here) + max_tokens


def standin(chunks: int = CHUNKS, chunk_s: float = CHUNK_S) -> FastAPI:
    """A backend that streams `chunks` chunks, then its usage; it counts the streams it holds
    at once (`app.state.most`): more than its budget allows means it was over-booked."""
    app = FastAPI()
    app.state.open, app.state.most = 0, 0
    app.state.minivtc = type("S", (), {"limits": Limits()})()
    app.get("/health")(lambda: {"status": "ok"})

    async def completions():
        head = {"id": "c", "object": "text_completion", "created": 0, "model": "m"}
        choice = {"index": 0, "text": "x", "logprobs": None, "finish_reason": None}
        usage = {"prompt_tokens": 4, "completion_tokens": chunks, "total_tokens": 4 + chunks}

        async def lines():
            app.state.open += 1
            app.state.most = max(app.state.most, app.state.open)
            try:
                for _ in range(chunks):
                    await asyncio.sleep(chunk_s)
                    yield f"data: {json.dumps(head | {'choices': [choice]})}\n\n"
                yield f"data: {json.dumps(head | {'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                app.state.open -= 1

        return StreamingResponse(lines(), media_type="text/event-stream")

    app.post("/v1/completions")(completions)
    return app


def gateway_app(urls: list[str], store, sync_s: float = 0.02, per_backend: int = 1):
    """A gateway over `urls`, each backend's budget `per_backend` requests; with `store`,
    one of the fleet sharing it."""
    tokenizer = Tokenizer(bundled_weights_dir() / "tokenizer.model")
    vtc = VTC(weights=weights_of(KEYS))
    backends = [Backend(url, NEED * per_backend) for url in urls]
    member = None
    if store is not None:
        member = Member(f"gw-{id(vtc)}", store, PolicyBooks(vtc), backends, sync_s)
    gateway = Gateway(vtc, backends, tokenizer, "m", Auth(KEYS), 0.2, member=member)
    if member is None:
        gateway.gateway_id = f"alone-{id(vtc)}"
    return make_gateway(gateway), gateway


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def complete(url: str, key: str) -> int:
    body = {"prompt": "Hi there", "max_tokens": CHUNKS, "stream": True}
    headers = {"authorization": f"Bearer {key}"}
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200
        return sum(1 for line in r.iter_lines() if '"text"' in line)


async def flood(url: str, key: str, streams: int, until: float) -> int:
    """`streams` streams kept open until `until`: the output tokens received."""
    got = 0
    body = {"prompt": "Hi there", "max_tokens": CHUNKS, "stream": True}
    headers = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=60) as http:

        async def one() -> None:
            nonlocal got
            while time.monotonic() < until:
                async with http.stream(
                    "POST", url + "/v1/completions", json=body, headers=headers
                ) as r:
                    async for line in r.aiter_lines():
                        got += '"text"' in line

        await asyncio.gather(*(one() for _ in range(streams)))
    return got


@pytest.fixture
def store(redis_url):
    """A fresh fleet in the module's Redis server: its own key prefix."""
    return RedisStore(parse_store_url(redis_url), f"fleet-{time.monotonic_ns()}", lease_s=1.0)


def test_two_gateways_share_one_counter_and_never_over_book_a_backend(store):
    backend = standin()
    with BackgroundServer(backend) as b:
        app1, app2 = gateway_app([b], store)[0], gateway_app([b], store)[0]
        with BackgroundServer(app1) as u1, BackgroundServer(app2) as u2:

            async def both() -> list[int]:
                runs = [asyncio.to_thread(complete, u, "sk-w1-tenant") for u in (u1, u2) * 3]
                return await asyncio.gather(*runs)

            assert asyncio.run(both()) == [CHUNKS] * 6
            time.sleep(0.2)  # a few syncs
            views = [httpx.get(u + "/fairness", headers=ADMIN).json() for u in (u1, u2)]
            tenant = {"authorization": "Bearer sk-w1-tenant"}
            own = httpx.get(u1 + "/fairness", headers=tenant).json()
    assert list(own["clients"]) == ["w1"] and "waiting_elsewhere" not in own["fleet"]
    assert backend.state.most == 1  # one request's room: never two at once, whoever booked
    counters = {v["clients"]["w1"]["counter"] for v in views}
    assert counters == {6 * (4 + 2 * CHUNKS)}  # all six, in both gateways' views
    assert views[0]["fleet"]["gateways"] == 2 and views[0]["bound"] > 0
    # which gateway served what: three each, the same table at both
    row = {"requests": 3, "input_tokens": 3 * 4, "output_tokens": 3 * CHUNKS}
    ids = sorted(v["gateway"] for v in views)
    assert views[0]["served"] == views[1]["served"] == {g: {"w1": row} for g in ids}


@pytest.mark.parametrize("shared", [True, False])
def test_a_four_to_one_pair_through_two_gateways_with_skewed_ingress(store, shared):
    """Dynamo's skewed row, live: w4 only through gateway 1, w1 only through gateway 2, both
    flooding two backends. With the store 4:1 holds; without it each gateway owns half of
    each backend (its slice) and the pair gets 1:1."""
    with BackgroundServer(standin()) as b1, BackgroundServer(standin()) as b2:
        per = 5 if shared else 2  # requests a backend holds; without a store, each gateway 2
        apps = [gateway_app([b1, b2], store if shared else None, per_backend=per) for _ in "12"]
        with BackgroundServer(apps[0][0]) as u1, BackgroundServer(apps[1][0]) as u2:
            until = time.monotonic() + 6.0

            async def run() -> list[int]:
                return await asyncio.gather(
                    flood(u1, "sk-w4-tenant", 12, until), flood(u2, "sk-w1-tenant", 12, until)
                )

            w4, w1 = asyncio.run(run())
    print(f"skewed ingress, {'with' if shared else 'without'} the store: w4 {w4}, w1 {w1}")
    if shared:
        assert 2.0 < w4 / w1 < 6.0, (w4, w1)  # (2.9 here: U is a second of service)
    else:
        assert 0.6 < w4 / w1 < 1.6, (w4, w1)


def test_a_dead_gateways_bookings_expire_and_a_dead_store_is_said(store):
    with BackgroundServer(standin()) as b:
        assert store.book(b, "dead-gateway/r1", NEED, NEED) == (True, NEED)  # never released
        app, gateway = gateway_app([b], store)
        with BackgroundServer(app) as url:
            start = time.monotonic()
            assert complete(url, "sk-w1-tenant") == CHUNKS
            assert time.monotonic() - start > 0.5  # it waited for the dead one's lease (1 s)
        assert gateway.dispatcher.backends[0].reserved == 0
    memory = MemoryStore(time.monotonic)
    with BackgroundServer(standin()) as b:
        app, gateway = gateway_app([b], memory)
        with BackgroundServer(app) as url:
            memory.up = False
            deadline = time.monotonic() + 10
            while gateway.member.down is None:  # (its next sync finds out)
                assert time.monotonic() < deadline, "the gateway did not notice"
                time.sleep(0.05)
            health = httpx.get(url + "/health").json()
            assert "store" in health and "down" in health["store"]
            assert complete(url, "sk-w1-tenant") == CHUNKS  # served on its own counters
            scraped = httpx.get(url + "/metrics", headers=ADMIN).text
            assert "minivtc_gateway_store_up 0.0" in scraped
            assert "minivtc_gateway_fleet_bound NaN" in scraped
            view = httpx.get(url + "/fairness", headers=ADMIN).json()
            assert view["bound"] is None and "down" in view["fleet"]["bound_is"]


def test_a_bad_store_is_a_clear_error_at_start(redis_url, capsys):
    args = ["route", "--backend", "http://127.0.0.1:9=100", "--port", "9"]
    assert main([*args, "--store", "redis://127.0.0.1:1/0"]) == 2
    assert "cannot reach the store" in capsys.readouterr().err
    wrong = redis_url.replace("test-store-password", "not-the-password")
    assert main([*args, "--store", wrong]) == 2
    err = capsys.readouterr().err
    assert "refused the password" in err and "Traceback" not in err
    assert main([*args, "--store", "redis://:x@127.0.0.1:notaport/0"]) == 2
    assert "--store" in capsys.readouterr().err


def redis_server(port: int, password: str):
    import shutil
    import subprocess

    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    args = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
    proc = subprocess.Popen(
        [*args, "no", "--requirepass", password],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def test_the_store_killed_and_restarted_empty_loses_no_counter():
    """The store dies: the gateway serves on, saying so; it comes back empty (no
    persistence): the gateway's counters go back in as floors, none reset."""
    port = free_port()
    proc = redis_server(port, "pw-restart")
    url = f"redis://:pw-restart@127.0.0.1:{port}/0"
    store = RedisStore(parse_store_url(url), "restart", lease_s=1.0, timeout_s=0.2)
    try:
        with BackgroundServer(standin()) as b:
            app, gateway = gateway_app([b], store)
            with BackgroundServer(app) as gw:
                assert complete(gw, "sk-w1-tenant") == CHUNKS
                proc.kill()
                proc.wait()
                assert complete(gw, "sk-w1-tenant") == CHUNKS  # served on its own counters
                time.sleep(0.5)
                assert "down" in httpx.get(gw + "/health").json()["store"]
                counter = gateway.dispatcher.scheduler.ledger.counter("w1")
                assert counter == 2 * (4 + 2 * CHUNKS)
                proc = redis_server(port, "pw-restart")
                deadline = time.monotonic() + 5
                while gateway.member.down is not None:  # tried again every second
                    assert time.monotonic() < deadline, "the gateway did not see the store again"
                    time.sleep(0.1)
                time.sleep(0.2)
                assert httpx.get(gw + "/health").json() == {"status": "ok"}
                fresh = RedisStore(parse_store_url(url), "restart")
                assert fresh.booked_now([b]) == {b: 0}
                assert gateway.dispatcher.scheduler.ledger.counter("w1") == counter
                got = fresh.redis.hget("restart:counters", "w1")
                assert float(got) == counter
                served = fresh.redis.hget(f"restart:served:{gateway.gateway_id}", "w1")
                assert served == f"2,8,{2 * CHUNKS}"  # what it served, written again
    finally:
        proc.kill()
        proc.wait()


def test_a_gateway_killed_mid_stream_frees_its_room_by_its_lease(redis_url):
    """Two `minivtc route --store` processes; the one streaming is killed (SIGKILL: no goodbye).
    The other serves on: the dead one's booking expires after its lease (1 s), and what the
    dead one charged before its last sync stays charged."""
    import os
    import signal
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MINIVTC_STORE": redis_url}
    with BackgroundServer(standin(chunks=20, chunk_s=0.1)) as backend:
        prefix = f"kill-{time.monotonic_ns()}"
        args = [sys.executable, "-m", "minivtc", "route", "--backend", f"{backend}={4 + 20}"]
        args += ["--store-prefix", prefix, "--lease", "1", "--sync", "0.05"]
        ports = [free_port(), free_port()]
        procs = [subprocess.Popen([*args, "--port", str(p)], env=env) for p in ports]
        try:
            urls = [f"http://127.0.0.1:{p}" for p in ports]
            for url, proc in zip(urls, procs, strict=True):
                deadline = time.monotonic() + 60
                while not healthy(url):
                    assert time.monotonic() < deadline and proc.poll() is None, "no gateway"
                    time.sleep(0.2)
            body = {"prompt": "Hi there", "max_tokens": 20, "stream": True}
            who = {"x-client-id": "tenant"}
            with httpx.stream("POST", urls[0] + "/v1/completions", json=body, headers=who) as r:
                lines = (line for line in r.iter_lines() if '"text"' in line)
                next(lines), next(lines), next(lines)
                time.sleep(0.2)  # (a sync carries its charges)
                procs[0].send_signal(signal.SIGKILL)
                procs[0].wait()
            start = time.monotonic()
            r = httpx.post(urls[1] + "/v1/completions", json=body, headers=who, timeout=30)
            assert r.status_code == 200 and r.text.count('"text"') == 20  # served whole
            waited = time.monotonic() - start
            assert waited > 0.3  # it waited for the dead one's lease, not forever
            view = httpx.get(urls[1] + "/fairness").json()
            counter = view["clients"]["tenant"]["counter"]
            assert counter >= 4 + 2 * 3  # the dead one's prompt and the tokens it had passed on
            ids = [f"{socket.gethostname()}:{p}" for p in ports]  # (`minivtc route`'s ids)
            assert view["gateway"] == ids[1] and view["served"][ids[1]]["tenant"]["requests"] == 1
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
