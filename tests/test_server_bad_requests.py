"""The server under attack and abuse: one bad request never takes it down.

Each test starts a real uvicorn server on the bundled model (the engine with
`check_invariants=True`) and checks that bystanders are served as before and that the pool
returns to fully free. Every input tried (with `tests/test_server.py`'s BAD_INPUT for the
ordinary mistakes) and what the server answers:

| input | answer |
| --- | --- |
| `seed` of 2**64, -1 or 2**63 | 400, param `seed`; 2**63 - 1 is served |
| a fault in one request's sampling, seed or text (injected) | that stream: one error event (an OpenAI error object), no [DONE]; not streaming: 500; everyone else served |
| a forward pass that fails (not one request's fault) | 500 for those in flight; `minivtc serve` exits with 1 |
| a 10 MB body, with Content-Length or streamed without | 413 before parsing; `/health` answers meanwhile (3-30 ms on an idle machine) |
| a 5 MB prompt through `openai.AsyncOpenAI`; 6, 10.5 and 20 MB bodies through async httpx, with Content-Length and chunked; a 20 MB body with a bad key (`test_server_limits`) | a readable 413 (401): the door drops up to 64 MiB of what is still coming before it answers, so the client is not reset mid-upload (and the SDK does not retry) |
| 30 connections sending part of a head; a body that stops half-way (`test_server_limits`, `--header-timeout 1 --body-timeout 1 --max-connections 20`) | 503 beyond 20 connections (uvicorn's `limit_concurrency`); each trickling head closed 1.0 s after it connected; the half body 408; then served as before |
| a prompt or chat text too long to ever fit | 400 before tokenizing (param `prompt` / `messages`) |
| three chats of 80,001 one-character messages at once, a stream running (`test_server_limits`) | 400 (more messages than the context has room for) before any per-message work, bodies parsed off the event loop; /health 20-94 ms, largest stream gap 85-87 ms on a busy 2-core machine (were 1.28 s and 1.37 s) |
| a 1 MB `model` or field name; 20,000 messages with bad roles; "system, system, user"; an empty body (`test_server_limits`) | a short error (input quoted up to 200 characters) that says what is wrong: `messages[1] is 'system' where 'user' must be`, `the body is empty` |
| a lone surrogate in `user`, `prompt` (text or list), `model`, `stop`, a message's `content` | 400 naming the field; `/fairness` and `/metrics` stay up |
| a 5000-digit integer; JSON nested 100k deep; a list or a string as the body | 400, OpenAI's error body |
| `stream_options` without `stream: true` | 400 |
| an unknown route; the wrong method | 404; 405; OpenAI's error body |
| a client id over 128 characters (header or `user`) | 400 |
| 300 client ids, each used once | idle ones forgotten; `/metrics` sums them under `(other)`, no token lost |
| with keys: a tenant idle while the server forgets idle clients (`test_server_limits`) | never forgotten: its `/fairness` row, weight and `/metrics` label stay, its totals only grow; a proxy's end users are forgotten as before |
| with keys: no key, an unknown key | 401 (`missing_api_key`, `invalid_api_key`) |
| with keys: a tenant claiming another client (header, `user`) | charged to its own key's client |
| with keys: any key but a `"proxy": true` one naming a client (`test_api_keys`); `--trust-client-header` with keys (`test_cli`) | charged to its own key's client; only the proxy's key names its end users; the flag is refused, pointing to `"proxy": true` |
| with keys: a tenant reading `/metrics`, `/fairness` | 403; only its own row |
| with keys: a tenant reading `/fairness` while another streams a 801-token prompt (`test_server_limits`) | its view unchanged: its own row (with the KV blocks it holds), the pool's size, no pool-wide `used_blocks` |
| a fresh `X-Client-Id` per request (Sybil) against a victim | open: the attacker takes most dispatches; with keys: 10-14 of 24 for the victim |
| 40,000 commands to an engine loop as it dies | every one answered or refused, none hangs |
| `--reservation none --victim fair --preempt-gap 1` (blocks of 16; `test_fair_preemption`) | refused at start: a gap below one block's decode charge, w_q x block_size = 32, lets a readmitted request be displaced before it generates a block (simulated: 9,687 preemptions for 30 requests at gap 1, 1,463 at 32, 48 at the default) |
| SIGTERM with a stream in flight, `--shutdown-timeout 1` | the stream ends with an error event about 1 s later; the process exits |
| 4 clients x 15 requests, streams cut mid-way, bad input interleaved | every good request once, every bad one its 4xx, the pool free |
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from minivtc.engine.factory import build_engine
from minivtc.model.tokenizer import Tokenizer
from minivtc.model.weights import BUNDLED_WEIGHTS
from minivtc.serving.connections import Limits
from minivtc.serving.hosting import BackgroundServer
from minivtc.serving.server import make_app
from tests.conftest import start_serve
from tests.test_server import wait_until_idle

POISON = 4000  # a token id that the test tokenizer below fails to detokenize


class PoisonedTokenizer(Tokenizer):
    """The bundled tokenizer, except that a request whose prompt holds `POISON` has a
    detokenizer that raises at its third token: a fault in one request's own work."""

    def detokenizer(self, prompt_ids=None):
        inner = super().detokenizer(prompt_ids)
        if POISON not in (prompt_ids or []):
            return inner
        calls = []

        class Failing:
            def add(self, token: int) -> str:
                calls.append(token)
                if len(calls) == 3:
                    raise UnicodeError("injected fault")
                return inner.add(token)

            def flush(self) -> str:
                return inner.flush()

        return Failing()


@pytest.fixture(scope="module")
def poisoned(bundled):
    model, _ = bundled
    tok = PoisonedTokenizer(BUNDLED_WEIGHTS / "tokenizer.model")
    engine = build_engine(model, tok, "vtc", kv_tokens=1024, check_invariants=True)
    with BackgroundServer(make_app(engine, tok)) as url:
        yield url
        assert httpx.get(url + "/health").status_code == 200, "the engine loop died"


def stream_events(url: str, body: dict) -> list[dict | str]:
    events = []
    with httpx.stream(
        "POST", url + "/v1/completions", json={**body, "stream": True}, timeout=60
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_an_out_of_range_seed_is_a_400_and_the_engine_serves_on(poisoned):
    for seed in (18446744073709551616, -1, 2**63):
        r = httpx.post(
            poisoned + "/v1/completions", json={"prompt": "x", "max_tokens": 2, "seed": seed}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.text
    r = httpx.post(
        poisoned + "/v1/completions", json={"prompt": "x", "max_tokens": 2, "seed": 2**63 - 1}
    )
    assert r.status_code == 200, r.text


def test_a_fault_in_one_request_fails_it_alone(poisoned):
    """The injected fault ends the poisoned stream with one error event (a plain OpenAI error
    object, not double-encoded) and the poisoned whole completion with a 500; a bystander
    streaming at the same time gets all of its tokens; the pool is free afterwards."""
    done = {}

    def bystander() -> None:
        body = {"prompt": "The class", "max_tokens": 48, "ignore_eos": True}
        done["events"] = stream_events(poisoned, body)

    thread = threading.Thread(target=bystander)
    thread.start()
    bad = {"prompt": [1, POISON, 450], "max_tokens": 20, "ignore_eos": True}
    events = stream_events(poisoned, bad)
    assert len(events) == 3, events  # two tokens, then the error; no [DONE]
    error = events[-1]["error"]
    assert error["type"] == "server_error" and "injected fault" in error["message"], error
    whole = httpx.post(poisoned + "/v1/completions", json=bad, timeout=60)
    assert whole.status_code == 500 and "injected fault" in whole.json()["error"]["message"]
    thread.join(timeout=60)
    tokens = [e for e in done["events"] if isinstance(e, dict) and e.get("choices")]
    assert len(tokens) == 48 and done["events"][-1] == "[DONE]"
    view = wait_until_idle(poisoned)
    assert view["kv"]["used_blocks"] == 0


# --- every other row of the table, each a test -------------------------------------------------


@pytest.fixture(scope="module")
def plain(bundled):
    """An open server (no keys), a small body limit so the tests send little."""
    model, tokenizer = bundled
    engine = build_engine(model, tokenizer, "vtc", kv_tokens=1024, check_invariants=True)
    limits = Limits(max_body_bytes=256 * 1024)
    app = make_app(engine, tokenizer, limits=limits, forget_every_s=0.2)
    with BackgroundServer(app) as url:
        yield url, app.state.minivtc.loop
        assert httpx.get(url + "/health").status_code == 200, "the engine loop died"


def openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, f"{r.status_code} {r.text[:300]}"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    return error


def test_a_body_over_the_limit_is_413_before_parsing_and_health_stays_fast(plain):
    """Three 10 MB bodies at once: each a 413 (by Content-Length, and by counting when the
    client streams the body without one), and /health answers meanwhile."""
    url, _ = plain
    big = b'{"prompt": "' + b"x" * 10_000_000 + b'"}'
    answers, slowest = [], []

    def send(chunked: bool) -> None:
        content = iter([big[i : i + 65536] for i in range(0, len(big), 65536)]) if chunked else big
        r = httpx.post(
            url + "/v1/completions",
            content=content,
            timeout=60,
            headers={"content-type": "application/json"},
        )
        answers.append(r)

    threads = [threading.Thread(target=send, args=(i == 2,)) for i in range(3)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        r = httpx.get(url + "/health", timeout=5)
        slowest.append(r.elapsed.total_seconds())
        assert r.status_code == 200
    for t in threads:
        t.join()
    for r in answers:
        openai_error(r, 413)
    print(
        f"\n/health while three 10 MB bodies were refused: {len(slowest)} probes, slowest "
        f"{1000 * max(slowest):.1f} ms"
    )
    # Tokenizing 10 MB on the event loop stalled /health for 8 s; the goal (< 100 ms, measured
    # by this print on an idle machine) is not asserted: a loaded CI machine may miss it.
    assert max(slowest) < 1.0, f"/health took {max(slowest):.3f} s: the event loop stalled"


def test_a_text_that_cannot_fit_is_refused_before_tokenizing(plain):
    url, _ = plain  # 1024 tokens of at most 16 characters each, 4x over for normalization
    r = httpx.post(url + "/v1/completions", json={"prompt": "ab" * 40_000, "max_tokens": 2})
    error = openai_error(r, 400)
    assert error["param"] == "prompt" and "80000 characters" in error["message"], error
    r = httpx.post(
        url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "ab" * 40_000}]},
    )
    assert openai_error(r, 400)["param"] == "messages"


LONE_SURROGATE = [  # (what, path, body with "\ud800" spelled in JSON, param)
    ("user", "/v1/completions", '{"prompt": "x", "max_tokens": 2, "user": "\\ud800"}', "user"),
    ("prompt", "/v1/completions", '{"prompt": "a\\ud800b", "max_tokens": 2}', "prompt"),
    ("prompt list", "/v1/completions", '{"prompt": ["\\ud800"], "max_tokens": 2}', "prompt.0"),
    ("model", "/v1/completions", '{"prompt": "x", "model": "\\ud800"}', "model"),
    ("stop", "/v1/completions", '{"prompt": "x", "stop": ["\\udfff"]}', "stop.0"),
    (
        "chat content",
        "/v1/chat/completions",
        '{"messages": [{"role": "user", "content": "\\ud800"}]}',
        "messages.0.content",
    ),
]


def test_invalid_unicode_in_any_field_is_a_400_and_the_views_stay_up(plain):
    url, _ = plain
    for what, path, body, param in LONE_SURROGATE:
        r = httpx.post(
            url + path, content=body.encode(), headers={"content-type": "application/json"}
        )
        error = openai_error(r, 400)
        assert error["param"] == param and "Unicode" in error["message"], (what, error)
    assert httpx.get(url + "/fairness").status_code == 200
    assert httpx.get(url + "/metrics").status_code == 200


MALFORMED = [  # (what, method, path, raw body, status)
    (
        "a 5000-digit integer",
        "POST",
        "/v1/completions",
        b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}",
        400,
    ),
    ("JSON nested 100k deep", "POST", "/v1/completions", b"[" * 100_000 + b"]" * 100_000, 400),
    ("a body that is not an object", "POST", "/v1/completions", b"[1, 2]", 400),
    ("a body that is a string", "POST", "/v1/completions", b'"hello"', 400),
    (
        "stream_options without stream",
        "POST",
        "/v1/completions",
        b'{"prompt": "x", "stream_options": {"include_usage": true}}',
        400,
    ),
    ("an unknown route", "POST", "/v1/nothing", b"{}", 404),
    ("the wrong method", "GET", "/v1/completions", b"", 405),
]


def test_every_error_uses_openais_body(plain):
    url, _ = plain
    for what, method, path, body, status in MALFORMED:
        r = httpx.request(
            method, url + path, content=body or None, headers={"content-type": "application/json"}
        )
        error = openai_error(r, status)
        assert "None" not in error["message"], (what, error)


@pytest.mark.slow
def test_client_ids_are_capped_and_idle_clients_forgotten(plain):
    """An id over 128 characters is a 400. 300 distinct ids come and go: the engine forgets
    the idle ones (their totals stay in the metrics under "(other)"), and a scrape stays small."""
    url, loop = plain
    r = httpx.post(
        url + "/v1/completions",
        json={"prompt": "x", "max_tokens": 1},
        headers={"X-Client-Id": "c" * 129},
    )
    assert openai_error(r, 400)["param"] == "X-Client-Id"

    async def many() -> None:
        async with httpx.AsyncClient(timeout=60) as http:
            for chunk in range(0, 300, 50):
                await asyncio.gather(
                    *(
                        http.post(
                            url + "/v1/completions",
                            json={"prompt": "x", "max_tokens": 1},
                            headers={"X-Client-Id": f"visitor-{i}"},
                        )
                        for i in range(chunk, chunk + 50)
                    )
                )

    asyncio.run(many())
    wait_until_idle(url)
    deadline = time.monotonic() + 10
    while len(httpx.get(url + "/fairness").json()["clients"]) > 5:
        assert time.monotonic() < deadline, "idle clients were not forgotten"
        time.sleep(0.2)
    text = httpx.get(url + "/metrics").text
    assert 'minivtc_client_output_tokens_total{client="(other)"}' in text
    totals = {
        ln.split('"')[1]: float(ln.split()[-1])
        for ln in text.splitlines()
        if ln.startswith("minivtc_client_output_tokens_total{")
    }
    assert totals["(other)"] >= 290 and sum(totals.values()) >= 300, totals  # none lost
    assert len(text) < 20_000, f"a scrape of {len(text)} bytes"


KEYS = {
    "sk-victim-0001": {"client": "victim"},
    "sk-attacker-01": {"client": "attacker"},
    "sk-operator-01": {"client": "ops", "admin": True},
}


def sybil_share(bundled, keys: dict | None) -> int:
    """The Sybil attack: an attacker sends 24 requests, each under a fresh X-Client-Id; a
    victim sends 24. Of the first 24 to be admitted, how many are the victim's?"""
    from minivtc.serving.api_keys import Auth, Key

    model, tokenizer = bundled
    auth = Auth({k: Key(**v) for k, v in keys.items()} if keys else None)
    engine = build_engine(model, tokenizer, "vtc", kv_tokens=1024, max_running=4)
    admitted: list[str] = []
    admit = engine.admit

    def recording_admit(request) -> None:  # the engine thread's record of dispatch order
        admit(request)  # (called once its blocks are reserved: it is dispatched next)
        admitted.append(request.client_id)

    engine.admit = recording_admit
    with BackgroundServer(make_app(engine, tokenizer, auth=auth)) as url:

        async def flood() -> None:
            async with httpx.AsyncClient(timeout=120) as http:

                def send(who: str, i: int):
                    headers = {"X-Client-Id": f"{who}-{i}" if who == "attacker" else who}
                    if keys:
                        key = next(k for k, v in keys.items() if v["client"] == who)
                        headers["Authorization"] = f"Bearer {key}"
                    body = {"prompt": "x", "max_tokens": 16, "ignore_eos": True}
                    return http.post(url + "/v1/completions", json=body, headers=headers)

                sends = [send(w, i) for i in range(24) for w in ("attacker", "victim")]
                answers = await asyncio.gather(*sends)
                assert all(a.status_code == 200 for a in answers), [a.text for a in answers][:3]

        asyncio.run(flood())
    return sum(1 for c in admitted[:24] if c == "victim")


@pytest.mark.slow
def test_api_keys_stop_a_sybil_attack(bundled):
    open_share = sybil_share(bundled, None)
    keyed_share = sybil_share(bundled, KEYS)
    print(
        f"\nvictim's share of the first 24 dispatches: open {open_share}, with keys {keyed_share}"
    )
    assert open_share <= 6, "without keys the attacker's fresh ids should win most dispatches"
    assert 10 <= keyed_share <= 14


def test_api_keys_authenticate_and_scope_the_views(bundled, tmp_path):
    from minivtc.serving.api_keys import Auth, read_keys

    path = tmp_path / "keys.json"
    path.write_text(json.dumps(KEYS))
    model, tokenizer = bundled
    engine = build_engine(model, tokenizer, "vtc", kv_tokens=1024)
    auth = Auth(read_keys(path))
    with BackgroundServer(make_app(engine, tokenizer, auth=auth)) as url:
        body = {"prompt": "x", "max_tokens": 2}
        assert openai_error(httpx.post(url + "/v1/completions", json=body), 401)
        bad = {"Authorization": "Bearer sk-not-a-key"}
        error = openai_error(httpx.post(url + "/v1/completions", json=body, headers=bad), 401)
        assert error["code"] == "invalid_api_key"
        victim = {"Authorization": "Bearer sk-victim-0001", "X-Client-Id": "attacker"}
        r = httpx.post(url + "/v1/completions", json={**body, "user": "ops"}, headers=victim)
        assert r.status_code == 200  # charged to the key's client, not to what it claims
        rows = httpx.get(url + "/fairness", headers=victim).json()["clients"]
        assert list(rows) == ["victim"] and rows["victim"]["output_tokens"] >= 1
        openai_error(httpx.get(url + "/metrics", headers=victim), 403)
        ops = {"Authorization": "Bearer sk-operator-01"}
        assert httpx.get(url + "/metrics", headers=ops).status_code == 200
        assert "victim" in httpx.get(url + "/fairness", headers=ops).json()["clients"]
        assert httpx.get(url + "/health").status_code == 200  # no key needed
    for broken, why in (
        ({"sk-x": {"client": "a"}}, "shorter than 8"),
        ({"sk-long-key-1": {"client": "a", "weight": 0}}, "weight"),
    ):
        path.write_text(json.dumps(broken))
        with pytest.raises(ValueError, match=why):
            read_keys(path)


@pytest.mark.slow
def test_the_engine_loop_answers_every_command_even_as_it_dies():
    """EngineLoop.call used to check `alive`, then queue: a loop dying in between left the
    handler waiting forever. Now every command is answered or refused."""
    from minivtc.serving.engine_loop import EngineLoop

    class Dying:
        steps = 0

        def has_unfinished(self) -> bool:
            return True

        def step(self):
            self.steps += 1
            time.sleep(0.001)
            if self.steps == 50:
                raise RuntimeError("boom")
            return []

    fatal = []
    loop = EngineLoop(Dying(), on_fatal=fatal.append).start()

    async def hammer() -> tuple[int, int]:
        results = await asyncio.wait_for(
            asyncio.gather(*(loop.call(lambda: 1) for _ in range(2000)), return_exceptions=True),
            timeout=10,
        )
        return sum(r == 1 for r in results), sum(isinstance(r, RuntimeError) for r in results)

    async def waves() -> tuple[int, int]:
        done = refused = 0
        for _ in range(20):
            d, r = await hammer()
            done, refused = done + d, refused + r
            await asyncio.sleep(0.01)
        return done, refused

    done, refused = asyncio.run(waves())
    assert done + refused == 40_000 and refused > 0
    loop.thread.join(timeout=5)
    assert len(fatal) == 1 and "boom" in repr(fatal[0])


@pytest.mark.slow
def test_forgetting_idle_clients_changes_no_decision():
    """The real trace under VTC (and under FCFS and RPM), once as it is and once with the
    engine forgetting every idle client it may after every step: the same requests, served at
    the same times (the argument is in `VTCLedger.forget`'s docstring)."""
    from minivtc.engine.engine import Engine, forget_idle_clients
    from minivtc.sim.simulator import simulate
    from minivtc.sim.workloads import workload

    trace = workload("real").make()[:600]
    forgets = []

    class Forgetful(Engine):
        def step(self):
            forgets.append(len(forget_idle_clients(self)))
            return super().step()

    for policy in ("vtc", "fcfs", "rpm:5", "vtc-predict"):
        kept = simulate(trace, policy)
        import minivtc.sim.simulator as sim

        original, sim.Engine = sim.Engine, Forgetful
        try:
            forgetful = simulate(trace, policy)
        finally:
            sim.Engine = original
        assert forgetful.served == kept.served, policy
        assert forgetful.steps == kept.steps, policy
        for client, counter in forgetful.counters.items():  # the survivors' counters agree
            assert counter == kept.counters[client], (policy, client)
    assert sum(forgets) > 100, "the test must actually forget clients"


def test_soak_mixed_load_with_disconnects_and_bad_input(plain):
    """Bounded: 4 clients x 15 requests (streaming and not), a third of the streams cut after
    two chunks, a bad request between every few good ones. Every good request completes
    exactly once, every bad one gets its 4xx, the pool ends fully free."""
    url, _ = plain
    bad_bodies = [
        ({"prompt": "x", "seed": -5}, 400),
        ({"prompt": 5}, 400),
        ({"prompt": "x", "user": "u" * 200}, 400),
        ({"prompt": "x", "n": 17}, 400),
    ]

    async def client(http: httpx.AsyncClient, c: int) -> tuple[int, int, int]:
        good = cut = bad = 0
        for i in range(15):
            body = {"prompt": f"Request {i} of", "max_tokens": 12, "ignore_eos": True}
            headers = {"X-Client-Id": f"soak-{c}"}
            if i % 4 == 3:
                wrong, status = bad_bodies[(i + c) % len(bad_bodies)]
                r = await http.post(url + "/v1/completions", json=wrong)  # (user: its id)
                assert r.status_code == status and r.json()["error"]["message"], r.text
                bad += 1
            elif i % 3 == 0:
                async with http.stream(
                    "POST", url + "/v1/completions", headers=headers, json={**body, "stream": True}
                ) as r:
                    chunks = 0
                    async for line in r.aiter_lines():
                        chunks += line.startswith("data: {")
                        if chunks == 2 and i % 2 == 0:
                            cut += 1
                            break  # hang up mid-stream
                    else:
                        assert chunks == 12, chunks
                        good += 1
            else:
                r = await http.post(url + "/v1/completions", json=body, headers=headers)
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 12
                good += 1
        return good, cut, bad

    async def run() -> list[tuple[int, int, int]]:
        async with httpx.AsyncClient(timeout=120) as http:
            return await asyncio.gather(*(client(http, c) for c in range(4)))

    results = asyncio.run(run())
    assert sum(g + cut + b for g, cut, b in results) == 60
    assert all(cut > 0 and b > 0 for _, cut, b in results)
    view = wait_until_idle(url)
    assert view["kv"]["used_blocks"] == 0


@pytest.mark.slow
def test_serve_shutdown_timeout_ends_in_flight_streams_with_an_error(tmp_path):
    """`minivtc serve --shutdown-timeout 1`: SIGTERM during a long stream; about a second later
    the stream ends with an error event and the process exits."""
    import signal

    server, url = start_serve("--kv-tokens", "2048", "--shutdown-timeout", "1")
    try:
        body = {"prompt": "x", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        events, started = [], None
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                    if len(events) == 3:
                        server.send_signal(signal.SIGTERM)
                        started = time.monotonic()
        took = time.monotonic() - started
        assert '"error"' in events[-1] and "shut down" in events[-1], events[-1]
        assert 0.8 < took < 10, took
        # uvicorn re-raises the signal it caught once it has shut down: death by SIGTERM
        assert server.wait(timeout=30) in (0, -signal.SIGTERM)
    finally:
        if server.poll() is None:
            server.kill()


def test_a_fault_beyond_one_request_stops_the_server_with_exit_code_1(bundled):
    """A forward pass that fails (not one request's fault) leaves the engine untrustworthy:
    the request in flight gets a 500, and `Server.run()` -- what `minivtc serve` returns --
    ends with 1 instead of answering 503 forever."""
    import socket

    from minivtc.serving.server import Server

    class Broken:
        def run(self, requests, allocator):
            raise RuntimeError("boom: the forward pass failed")

        def release(self, request):
            pass

    model, tokenizer = bundled
    engine = build_engine(model, tokenizer, "fcfs", kv_tokens=1024)
    engine.runner = Broken()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = Server(engine, tokenizer, "minivtc-tiny", "127.0.0.1", port, shutdown_timeout=1)
    code = []
    thread = threading.Thread(target=lambda: code.append(server.run()))
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not server.server.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.05)
    r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 4}, timeout=30)
    assert r.status_code == 500 and "boom" in r.json()["error"]["message"]
    thread.join(timeout=30)
    assert code == [1]
    assert server.loop.thread is None  # the engine ran on the thread that called run()
