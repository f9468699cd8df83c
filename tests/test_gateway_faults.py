"""The gateway facing hostile backends and departing callers: stand-in backends that hang,
answer what no OpenAI server sends, or report impossible usage; callers that leave while
queued; `n` samples. Each must end in a clean answer (a 502, or the request gone from the
queue) with every reservation released."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from minivtc.fairness.cost import W_P, W_Q
from minivtc.fleet.backend import Backend
from minivtc.gateway.app import make_gateway
from minivtc.gateway.gateway import CHAT_ROOM
from minivtc.gateway.proxy import backends_of
from minivtc.model import chat
from minivtc.requests.params import DEFAULT_MAX_TOKENS
from minivtc.serving.connections import Limits
from minivtc.serving.hosting import BackgroundServer
from tests.test_gateway import fleet, free_port, gateway_over, healthy

HEADERS = {"authorization": "Bearer sk-picky"}


def answer(prompt: str, body: dict):
    """What the stand-in answers a non-streamed completion whose prompt is `prompt`."""
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}
    n = body.get("n") or 1
    choices = [{"index": k, "text": "abc", "finish_reason": "length"} for k in range(n)]
    usage = {"prompt_tokens": 7, "completion_tokens": 3 * n, "total_tokens": 7 + 3 * n}
    if prompt == "not json":
        return Response(b"{oops", media_type="application/json")
    if prompt == "a list":
        return JSONResponse([1, 2, 3])
    if prompt == "huge":  # 40 MB of text
        return JSONResponse(head | {"choices": [{"index": 0, "text": "a" * 40_000_000}]})
    if prompt == "null usage":
        usage = {"prompt_tokens": None, "completion_tokens": None}
    if prompt == "string usage":
        usage = {"prompt_tokens": "7", "completion_tokens": "lots"}
    if prompt == "endless usage":
        usage = {"prompt_tokens": 7, "completion_tokens": 10**12}
    return JSONResponse(head | {"choices": choices, "usage": usage})


def hostile_backend() -> FastAPI:
    """A stand-in that answers by its prompt: "hang" never answers; the others as `answer`.
    Streamed, it sends three chunks then a usage chunk that is the prompt's usage."""
    app = FastAPI()
    app.get("/health")(lambda: Response())

    async def completions(http: HTTPRequest):
        body = app.state.seen = await http.json()
        prompt = body["prompt"]
        if prompt == "hang":
            await asyncio.sleep(3600)
        if prompt == "slow":  # a stream that goes on (a chunk every 0.1 s) until closed
            return StreamingResponse(slowly(), media_type="text/event-stream")
        if not body.get("stream"):
            return answer(prompt, body)
        usage = json.loads(answer(prompt, body).body)["usage"]

        def lines():
            for k in range(3):
                yield f"data: {json.dumps({'choices': [{'index': 0, 'text': str(k)}]})}\n\n"
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n"

        return StreamingResponse(lines(), media_type="text/event-stream")

    async def chat(http: HTTPRequest):
        body = app.state.seen = await http.json()
        head = {"id": "chat-1", "object": "chat.completion", "created": 1, "model": "m"}
        usage = {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}
        if body.get("stream"):
            choice = {"index": 0, "delta": {"content": "a"}, "finish_reason": "length"}
            chunks = [head | {"choices": [choice], "usage": usage}]
            chunks.append(head | {"choices": [], "usage": usage})
            lines = [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]
            return StreamingResponse(iter(lines), media_type="text/event-stream")
        message = {"role": "assistant", "content": "a"}
        choice = {"index": 0, "message": message, "finish_reason": "length"}
        return JSONResponse(head | {"choices": [choice], "usage": usage})

    app.post("/v1/completions")(completions)
    app.post("/v1/chat/completions")(chat)
    app.state.minivtc = type("S", (), {"limits": Limits()})()
    return app


async def slowly():
    for k in range(10_000):
        await asyncio.sleep(0.1)
        yield f"data: {json.dumps({'choices': [{'index': 0, 'text': str(k)}]})}\n\n"


def complete(url: str, prompt: str, timeout: float = 30, **extra) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 3, **extra}
    return httpx.post(url + "/v1/completions", json=body, headers=HEADERS, timeout=timeout)


def released(url: str) -> bool:
    return all(b["reserved"] == 0 for b in fleet(url)["backends"])


def until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.slow
def test_a_backend_that_never_answers_is_given_up_on_and_its_room_freed():
    """Issue: the backend client had no read timeout a test could reach (600 s, fixed), so a
    request to a backend that never answers held its room. Now `backend_idle_s` (`minivtc
    route --backend-timeout`): a 502 once the backend has been silent that long, the room
    freed, and the backend is not marked down for it by the request's own timeout alone."""
    with BackgroundServer(hostile_backend()) as backend:
        gw = gateway_over(backends_of([f"{backend}=1000"]))
        gw.backend_idle_s = 1.0
        with BackgroundServer(make_gateway(gw)) as url:
            r = complete(url, "hang")
            assert r.status_code == 502, r.text
            assert r.json()["error"]["type"] == "server_error"
            assert until(lambda: released(url))


def test_backend_answers_are_validated_and_a_bad_one_is_a_502():
    """Issue: bad JSON or a list from a backend was a 500; a 200 MB answer took the gateway's
    memory with it. Now each is a 502 (the answer read at most 32 MB), the room is freed, and
    the backend stays in service (it answered: it is not down)."""
    with BackgroundServer(hostile_backend()) as backend:
        gw = gateway_over(backends_of([f"{backend}=1000"]))
        with BackgroundServer(make_gateway(gw)) as url:
            for prompt in ("not json", "a list", "huge"):
                r = complete(url, prompt, timeout=60)
                assert r.status_code == 502, (prompt, r.status_code, r.text[:200])
                assert "the backend failed" in r.json()["error"]["message"]
            assert released(url)
            assert all(b["healthy"] for b in fleet(url)["backends"])
            assert complete(url, "fine").status_code == 200


def test_impossible_usage_is_not_believed_and_the_room_is_released():
    """Issue: a backend's `usage` with null or string counts gave a 500 (or a cut stream) and
    the room stayed held until restart. Now a count that cannot be true (not a whole number,
    or more than was reserved) is ignored: the gateway charges its own count, answers 200
    and frees the room, streamed or not."""
    with BackgroundServer(hostile_backend()) as backend:
        gw = gateway_over(backends_of([f"{backend}=1000"]))
        with BackgroundServer(make_gateway(gw)) as url:
            for prompt in ("null usage", "string usage", "endless usage"):
                before = fleet(url)["clients"].get("picky", {}).get("counter") or 0
                assert complete(url, prompt).status_code == 200, prompt
                r = complete(url, prompt, stream=True)
                assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n"), r.text
                assert "error" not in r.text, r.text
                assert released(url), prompt
                charged = fleet(url)["clients"]["picky"]["counter"] - before
                assert 0 < charged <= 2 * (W_P * 1000 + W_Q * 3), (prompt, charged)


@pytest.mark.slow
def test_a_caller_that_leaves_takes_its_request_out_of_the_queue_at_once():
    """Issue: of 300 non-streamed requests whose callers gave up, 258 were still queued 10 s
    later, and the backends then ran them. Now the caller's leaving cancels its request: a
    queued one leaves the queue at once, a bound one is closed at its backend (its room
    freed)."""
    with BackgroundServer(hostile_backend()) as backend:
        gw = gateway_over(backends_of([f"{backend}=1000"]))
        with BackgroundServer(make_gateway(gw)) as url:

            def waiting() -> int:
                return fleet(url)["clients"].get("picky", {}).get("waiting", 0)

            async def run() -> tuple[bool, bool]:
                body = {"prompt": "hang", "max_tokens": 900}
                async with httpx.AsyncClient(base_url=url, timeout=60) as one:
                    bound = asyncio.create_task(
                        one.post("/v1/completions", json=body, headers=HEADERS)
                    )
                    await asyncio.sleep(0.5)
                    async with httpx.AsyncClient(base_url=url, timeout=60) as two:
                        queued = asyncio.create_task(
                            two.post("/v1/completions", json=body, headers=HEADERS)
                        )
                        await asyncio.to_thread(until, lambda: waiting() == 1)
                        queued.cancel()
                    left_queue = await asyncio.to_thread(until, lambda: waiting() == 0, 5.0)
                    bound.cancel()
                await asyncio.sleep(0)
                return left_queue, await asyncio.to_thread(until, lambda: released(url), 5.0)

            left_queue, freed = asyncio.run(run())
            assert left_queue, fleet(url)
            assert freed, fleet(url)


def test_n_samples_are_reserved_and_charged_as_n_requests():
    """Issue: with `n=16` the gateway reserved one sample's room while the backend held 16, and
    charged the prompt once where `serve` charges it 16 times. Now n samples reserve n times
    (prompt + max_tokens), so a request whose samples cannot all fit one backend is a 400,
    and the prompt is charged once per sample."""
    with BackgroundServer(hostile_backend()) as backend:
        gw = gateway_over(backends_of([f"{backend}=1000"]))
        with BackgroundServer(make_gateway(gw)) as url:
            r = complete(url, "fine", n=4)
            assert r.status_code == 200 and len(r.json()["choices"]) == 4
            counter = fleet(url)["clients"]["picky"]["counter"]
            assert counter == 4 * 7 * W_P + 12 * W_Q  # the backend's usage: prompt 7, 4 x 3
            too_many = {"prompt": "fine", "max_tokens": 300, "n": 4}  # 4 x 300 > 1000
            r = httpx.post(url + "/v1/completions", json=too_many, headers=HEADERS)
            assert r.status_code == 400 and "fits no backend" in r.json()["error"]["message"]
            assert released(url)


def start_route(tmp_path, *flags: str) -> tuple[subprocess.Popen, str, object]:
    """`minivtc route` as a process, its stderr in a file; returns it, its URL, the file."""
    port = free_port()
    keys = tmp_path / "keys.json"
    ops = {"client": "ops", "admin": True}
    keys.write_text(json.dumps({"sk-picky": {"client": "picky"}, "sk-ops-route": ops}))
    args = [sys.executable, "-m", "minivtc", "route", "--port", str(port)]
    args += ["--api-keys", str(keys), *flags]
    log = open(tmp_path / "route.log", "w+")  # noqa: SIM115 (read after the process ends)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while not healthy(url):
        assert time.monotonic() < deadline and proc.poll() is None, "the gateway did not start"
        time.sleep(0.2)
    return proc, url, log


@pytest.mark.slow
def test_shutdown_ends_every_request_with_an_openai_error_event(tmp_path):
    """Issue: on SIGTERM, streams still running (and those queued behind them) were cut at the
    graceful limit with no error event, and the log filled with tracebacks. Now, once
    `--shutdown-timeout` has passed, a stream running and one still queued each end with an
    OpenAI error event and [DONE], the process exits, and the log holds no traceback."""
    with BackgroundServer(hostile_backend()) as backend:
        proc, url, log = start_route(
            tmp_path, "--backend", f"{backend}=1000", "--shutdown-timeout", "1"
        )

        async def run() -> list[list[str]]:
            body = {"prompt": "slow", "max_tokens": 900, "stream": True}
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:

                async def one() -> list[str]:
                    async with http.stream(
                        "POST", "/v1/completions", json=body, headers=HEADERS
                    ) as r:
                        return [line async for line in r.aiter_lines() if line.startswith("data:")]

                running = asyncio.create_task(one())
                await asyncio.sleep(1.0)
                queued = asyncio.create_task(one())  # 900 + 900 > 1000: it waits
                await asyncio.sleep(1.0)
                proc.send_signal(signal.SIGTERM)
                return list(await asyncio.gather(running, queued))

        running, queued = asyncio.run(run())
        code = proc.wait(timeout=30)
    for lines in (running, queued):
        assert lines[-1] == "data: [DONE]", lines[-3:]
        error = json.loads(lines[-2][5:])["error"]
        assert "shut down" in error["message"] and error["type"] == "server_error", error
    assert len(running) > 3 and len(queued) == 2  # the queued one never reached a backend
    assert code in (0, -signal.SIGTERM)
    log.seek(0)
    assert "Traceback" not in log.read()


@pytest.mark.slow
def test_route_has_serves_connection_limits_flags_and_warning(tmp_path):
    """Issue: `route` had no head deadline, no connection cap, no timeout flags, and no
    warning when bound to a public address without keys. Now it takes `serve`'s flags: a
    connection that never finishes its head is closed at `--header-timeout`, and a keyless
    gateway on 0.0.0.0 warns."""
    with BackgroundServer(hostile_backend()) as backend:
        port = free_port()
        args = [sys.executable, "-m", "minivtc", "route", "--host", "0.0.0.0", "--port", str(port)]
        args += ["--backend", f"{backend}=1000", "--header-timeout", "1", "--max-connections", "8"]
        log = open(tmp_path / "route.log", "w+")  # noqa: SIM115
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while not healthy(url):
                assert time.monotonic() < deadline and proc.poll() is None, "did not start"
                time.sleep(0.2)
            with socket.create_connection(("127.0.0.1", port)) as slow:
                slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n")  # no end
                slow.settimeout(20)
                assert slow.recv(1024) == b""  # closed by the gateway, not by our timeout
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    log.seek(0)
    assert "WARNING: routing 0.0.0.0 without --api-keys" in log.read()


@pytest.mark.slow
def test_keys_a_short_api_key_is_refused_and_route_presents_its_key_to_backends(
    bundled, tmp_path, capsys
):
    """Issue: `serve --api-key x` was accepted (the keys file wants 8 characters); `route`
    could not send a key to its backends (a keyed backend answered 401, and without a budget
    `route` crashed with `KeyError: 'kv'`), so backends ran keyless. Now a short key is
    refused like the keys file's; `--backend-api-key` reads a keyed backend's budget and is
    sent with every request (the client named in the body, as the backend's proxy key
    allows); without it, `route` says what to do and exits 2, no traceback."""
    from minivtc.cli.main import main
    from minivtc.engine.factory import build_engine
    from minivtc.serving.api_keys import Auth, Key
    from minivtc.serving.server import make_app

    assert main(["serve", "--api-key", "x"]) == 2
    assert "shorter than 8 characters" in capsys.readouterr().err
    model, tokenizer = bundled
    engine = build_engine(model, tokenizer, "vtc", kv_tokens=512)
    proxy = {"sk-the-gateway": Key("gateway", proxy=True), "sk-ops-0001": Key("ops", admin=True)}
    with BackgroundServer(make_app(engine, tokenizer, auth=Auth(proxy))) as backend:
        args = ["route", "--port", str(free_port()), "--backend", backend]
        assert main(args) == 2
        assert "--backend-api-key" in capsys.readouterr().err
        proc, url, log = start_route(
            tmp_path, "--backend", backend, "--backend-api-key", "sk-the-gateway"
        )
        try:
            assert complete(url, "Once upon a time").status_code == 200
            rows = httpx.get(
                backend + "/fairness", headers={"authorization": "Bearer sk-ops-0001"}
            ).json()["clients"]
            assert "picky" in rows, rows
            assert rows["picky"]["output_tokens"] == 3, rows
            assert fleet_of(url)["backends"][0]["budget"] == 512
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def fleet_of(url: str) -> dict:
    """The fleet view of a `start_route` gateway, as its admin sees it."""
    return httpx.get(url + "/fairness", headers={"authorization": "Bearer sk-ops-route"}).json()


def test_valid_chats_pass_and_a_tenant_sees_no_fleet_totals():
    """Issue: at the gateway, text-part content, the `developer` role and a text part without
    text were 500s (`serve` answers them); `continuous_usage_stats` was silently dropped; a
    tenant's `/fairness` and `/dashboard/data` showed the fleet's `requests.served`. Now the
    chats are served, the stream options reach the backend, and a tenant sees its own row
    only."""
    app = hostile_backend()
    with BackgroundServer(app) as backend:
        gw = gateway_over(backends_of([f"{backend}=1000"]))
        with BackgroundServer(make_gateway(gw)) as url:
            chats = (
                [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}],
                [{"role": "user", "content": [{"type": "text"}, {"type": "text", "text": "x"}]}],
            )
            for messages in chats:
                body = {"messages": messages, "max_tokens": 1}
                r = httpx.post(url + "/v1/chat/completions", json=body, headers=HEADERS)
                assert r.status_code == 200, (messages, r.text)
            options = {"include_usage": True, "continuous_usage_stats": True}
            body = {"messages": chats[0], "max_tokens": 1, "stream": True}
            body["stream_options"] = options
            r = httpx.post(url + "/v1/chat/completions", json=body, headers=HEADERS)
            assert r.status_code == 200 and app.state.seen["stream_options"] == options
            for path in ("/fairness", "/dashboard/data"):
                view = httpx.get(url + path, headers=HEADERS).json()
                assert "requests" not in view and "backends" not in view, (path, view)
                assert set(view["clients"]) == {"picky"}


def test_a_request_without_max_tokens_is_sent_with_serves_default():
    """The gateway books, charges and sends what `serve` would give a request without
    max_tokens (`prompts.max_tokens_of`): 16 for a completion; for a chat the room its prompt
    leaves in the largest budget, at most `CHAT_ROOM`, as the gateway knows budgets, not
    contexts."""
    app = hostile_backend()
    messages = [{"role": "user", "content": "hi"}]
    with BackgroundServer(app) as backend:
        for budget in (1000, 100):  # a room past CHAT_ROOM, and one within it
            gw = gateway_over(backends_of([f"{backend}={budget}"]))
            room = budget - len(chat.prompt_ids(gw.tokenizer, messages))
            with BackgroundServer(make_gateway(gw)) as url:
                r = httpx.post(url + "/v1/completions", json={"prompt": "x"}, headers=HEADERS)
                assert r.status_code == 200 and app.state.seen["max_tokens"] == DEFAULT_MAX_TOKENS
                body = {"messages": messages}
                r = httpx.post(url + "/v1/chat/completions", json=body, headers=HEADERS)
                assert r.status_code == 200 and app.state.seen["max_tokens"] == min(room, CHAT_ROOM)


def test_requests_go_out_through_several_http_clients_in_turn():
    """httpcore walks every connection of a pool each time a response closes: one pool holding
    a class's 200 streams costs 200 walks of 200 connections on the event loop. The gateway's
    requests take turns over `REQUEST_CLIENTS` clients, so each pool holds a share of them."""
    from minivtc.fleet.backend import Backend
    from minivtc.gateway.app import REQUEST_CLIENTS, backend_clients

    gw = gateway_over([Backend("http://127.0.0.1:1", 1000)])
    gw.https, checks = backend_clients(1, 600.0)
    try:
        turns = [gw.client for _ in range(2 * REQUEST_CLIENTS)]
        assert REQUEST_CLIENTS >= 8 and len(gw.https) == REQUEST_CLIENTS
        assert len({id(c) for c in turns}) == REQUEST_CLIENTS  # every client used, in turn
        assert checks not in gw.https  # the health checks keep their own pool
    finally:
        for c in [*gw.https, checks]:
            asyncio.run(c.aclose())


def test_the_gateway_http_clients_share_one_tls_context():
    """Each httpx client made its own TLS context, reading the CA bundle: 17 of them held the
    event loop for 340 ms at startup (profiled). They share one now."""
    from minivtc.gateway.app import backend_clients

    requests, checks = backend_clients(2, 600.0)
    try:
        pools = [c._transport._pool for c in [*requests, checks]]  # (httpx's own, not public)
        assert len({id(pool._ssl_context) for pool in pools}) == 1
    finally:
        for c in [*requests, checks]:
            asyncio.run(c.aclose())


def test_a_caller_gone_while_its_request_waits_leaves_the_next_binding_whole():
    """A caller cancelled while its request waits for a backend (its waiter cancelled, its
    `finally` not yet run), then a round binds it and the next: the round tells the live
    waiter where to go (a cancelled waiter answered once raised, and every request the round
    bound after it waited for ever), and the gone caller's end frees its room."""

    async def main() -> None:
        gateway = gateway_over([Backend("b", 1000)])
        first = gateway.enqueue("alice", 10, 10)
        second = gateway.enqueue("bob", 10, 10)
        gateway.waiters[first.request_id].cancel()  # its caller's task was cancelled
        gateway.pump()  # binds both
        backend = await asyncio.wait_for(gateway.backend_for(second), 5)
        assert backend.name == "b" and backend.reserved == 40
        gateway.end(first, {})  # the gone caller's finally
        assert backend.reserved == 20

    asyncio.run(main())
