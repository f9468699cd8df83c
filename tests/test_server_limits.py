"""The server's limits: what one request, one client or one connection may cost everyone else.

Each test starts a real uvicorn server on the bundled model and attacks it; the rows they add
to the table of inputs and answers are in `tests/test_server_bad_requests.py`'s docstring.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from minivtc.engine.factory import build_engine
from minivtc.serving.hosting import BackgroundServer
from minivtc.serving.server import make_app
from tests.test_server_bad_requests import openai_error


@pytest.fixture(scope="module")
def open_server(bundled):
    """An open server (no keys), the default body limit (4 MiB), room for the whole context
    (2048 tokens: 80,001 characters may fit, so only the count refuses them unread)."""
    model, tokenizer = bundled
    engine = build_engine(model, tokenizer, "vtc", kv_tokens=2048, check_invariants=True)
    with BackgroundServer(make_app(engine, tokenizer)) as url:
        yield url
        assert httpx.get(url + "/health").status_code == 200, "the engine loop died"


def many_messages(n: int = 80_001) -> bytes:
    """n one-character messages, user and assistant alternating, ending with the user: 2.7 MB,
    under the body limit."""
    roles = ["user" if i % 2 == 0 else "assistant" for i in range(n)]
    return json.dumps({"messages": [{"role": r, "content": "a"} for r in roles]}).encode()


def test_many_small_messages_are_refused_before_any_per_message_work(open_server):
    """Three 80,001-message chats at once, while a stream runs and /health is probed: each is a
    400 (too many messages for the context), and neither the probes nor the stream stall. Before
    the messages were counted unread, /health took 2.44 s and the stream stalled 6.4 s; the
    goal is under 100 ms for both (printed; the assertion is generous, for a loaded machine)."""
    url, body = open_server, many_messages()
    answers, probes, gaps = [], [], []
    attack_on, attack_over = threading.Event(), threading.Event()

    def stream() -> None:
        request = {"prompt": "x", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=request, timeout=60) as r:
            last = None
            for _ in r.iter_lines():
                now = time.monotonic()
                if attack_on.is_set() and last is not None:
                    gaps.append(now - last)
                last = now
                if attack_over.is_set():
                    return
                attack_on.set()  # the stream is flowing: start the attack

    def attack() -> None:
        headers = {"content-type": "application/json"}
        answers.append(httpx.post(url + "/v1/chat/completions", content=body, headers=headers))

    streamer = threading.Thread(target=stream)
    streamer.start()
    assert attack_on.wait(timeout=30)
    attackers = [threading.Thread(target=attack) for _ in range(3)]
    for t in attackers:
        t.start()
    while any(t.is_alive() for t in attackers):
        probes.append(httpx.get(url + "/health", timeout=10).elapsed.total_seconds())
    attack_over.set()
    streamer.join(timeout=60)
    for r in answers:
        error = openai_error(r, 400)
        assert error["param"] == "messages" and "at most 343 messages" in error["message"], error
    print(
        f"\nthree 80,001-message chats refused: /health slowest {1000 * max(probes):.1f} ms "
        f"({len(probes)} probes), largest stream gap {1000 * max(gaps):.1f} ms (goal: 100 ms)"
    )
    assert max(probes) < 0.5 and max(gaps) < 0.5, "the event loop stalled"


BOUNDED_ECHO = [  # (what, path, body): each error message must quote at most ~200 characters
    ("a 1 MB model", "/v1/completions", {"prompt": "x", "model": "m" * 1_000_000}),
    ("a 1 MB unknown field", "/v1/completions", {"prompt": "x", "f" * 1_000_000: 1}),
    (
        "20,000 messages with bad roles",
        "/v1/chat/completions",
        {"messages": [{"role": "system", "content": "a"}] * 20_000},
    ),
    (
        "170 messages with bad roles",
        "/v1/chat/completions",
        {"messages": [{"role": "system", "content": "a"}] * 170},
    ),
]

TRUE_MESSAGES = [  # (what, path, raw body, what the message must say)
    (
        "system, system, user",
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "system", "content": "a"},
                {"role": "system", "content": "b"},
                {"role": "user", "content": "c"},
            ]
        },
        "messages[1] is 'system' where 'user' must be",
    ),
    (
        "only a system message",
        "/v1/chat/completions",
        {"messages": [{"role": "system", "content": "a"}]},
        "a system message must be followed by a user message",
    ),
    (
        "ending with the assistant",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
        "the last message must be from the user",
    ),
    ("an empty body", "/v1/completions", b"", "the body is empty"),
    ("an empty chat body", "/v1/chat/completions", b"", "the body is empty"),
    ("a body that is a list", "/v1/completions", b"[1]", "must be a JSON object"),
    ("bytes that are not UTF-8", "/v1/completions", b'{"prompt": "\xff"}', "not valid JSON"),
]


def test_error_messages_are_bounded_and_true(open_server):
    for what, path, body in BOUNDED_ECHO:
        r = httpx.post(open_server + path, json=body, timeout=30)
        assert 400 <= r.status_code < 500 and len(r.content) < 1000, (what, len(r.content))
        assert openai_error(r, r.status_code)["message"], what
    for what, path, body, says in TRUE_MESSAGES:
        if isinstance(body, bytes):
            headers = {"content-type": "application/json"}
            r = httpx.post(open_server + path, content=body, headers=headers)
        else:
            r = httpx.post(open_server + path, json=body)
        message = openai_error(r, 400)["message"]
        assert says in message and "None" not in message, (what, message)


KEYS = {
    "sk-alice-000001": {"client": "alice", "weight": 2},
    "sk-bob-00000001": {"client": "bob"},
    "sk-gateway-0001": {"client": "gateway", "proxy": True},
    "sk-operator-001": {"client": "ops", "admin": True},
}


def bearer(client: str, **headers: str) -> dict[str, str]:
    key = next(k for k, v in KEYS.items() if v["client"] == client)
    return {"Authorization": f"Bearer {key}", **headers}


@pytest.fixture(scope="module")
def keyed(bundled):
    """A server with API keys that forgets idle clients every 0.2 s."""
    from minivtc.serving.api_keys import Auth, Key, weights_of

    model, tokenizer = bundled
    keys = {k: Key(**v) for k, v in KEYS.items()}
    engine = build_engine(
        model,
        tokenizer,
        "vtc",
        kv_tokens=1024,
        check_invariants=True,
        weights=weights_of(keys),
    )
    auth = Auth(keys)
    with BackgroundServer(make_app(engine, tokenizer, auth=auth, forget_every_s=0.2)) as url:
        yield url
        assert httpx.get(url + "/health").status_code == 200, "the engine loop died"


def complete(url: str, headers: dict[str, str], max_tokens: int = 4) -> None:
    body = {"prompt": "x", "max_tokens": max_tokens, "ignore_eos": True}
    r = httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text


def admin_rows(url: str) -> dict[str, dict]:
    return httpx.get(url + "/fairness", headers=bearer("ops")).json()["clients"]


def test_a_tenant_with_a_key_is_never_forgotten(keyed):
    """alice works, then idles while the server forgets idle clients (the proxy's end user
    `visitor` is forgotten: forgetting ran); alice's row, weight and label stay, and her totals
    only grow. Only the proxy's key names a client: bob claiming to be alice is bob."""
    complete(keyed, bearer("gateway", **{"X-Client-Id": "visitor"}))
    complete(keyed, bearer("alice"))
    complete(keyed, bearer("bob", **{"X-Client-Id": "alice"}))  # last to leave: VTC keeps it
    deadline = time.monotonic() + 10
    while "visitor" in admin_rows(keyed):
        assert time.monotonic() < deadline, "idle clients were not forgotten"
        time.sleep(0.1)
    time.sleep(0.5)  # two more rounds of forgetting
    assert admin_rows(keyed)["gateway"]["output_tokens"] == 0  # (visitor was charged)
    own = httpx.get(keyed + "/fairness", headers=bearer("alice")).json()["clients"]
    assert list(own) == ["alice"] and own["alice"]["output_tokens"] == 4, own
    assert own["alice"]["weight"] == 2.0 and own["alice"]["input_tokens"] == 2
    assert admin_rows(keyed)["bob"]["output_tokens"] == 4  # (bob was charged, not alice)
    metrics = httpx.get(keyed + "/metrics", headers=bearer("ops")).text
    assert 'minivtc_client_output_tokens_total{client="alice"} 4.0' in metrics, metrics
    complete(keyed, bearer("alice"), max_tokens=3)
    assert admin_rows(keyed)["alice"]["output_tokens"] == 7  # grows from where it was


def test_a_tenant_sees_nothing_of_the_others_load(keyed):
    """A tenant could read another tenant's prompt sizes off `used_blocks` (9, 52, 102 blocks for
    101-, 801- and 1601-token prompts). Now, while bob streams with a 801-token prompt, alice's
    view is what it was before he started; the admin sees bob's blocks."""
    alice = bearer("alice")

    def alices_view() -> dict:  # (less her counter: the engine may forget her meanwhile)
        view = httpx.get(keyed + "/fairness", headers=alice).json()
        del view["clients"]["alice"]["counter"]
        return view

    before = alices_view()
    assert set(before["kv"]) == {"total_blocks", "block_size"}, before
    # the most the pool lets bob ask for: his blocks stay held while the views are read, for
    # as many steps as this machine takes to run 222 of them, not a time this test assumes
    body = {"prompt": [1] + [450] * 800, "max_tokens": 222, "ignore_eos": True, "stream": True}
    with httpx.stream(
        "POST", keyed + "/v1/completions", json=body, headers=bearer("bob"), timeout=60
    ) as r:
        chunks = 0
        for line in r.iter_lines():
            chunks += line.startswith("data: {")
            if chunks == 3:
                view = httpx.get(keyed + "/fairness", headers=bearer("ops")).json()
                assert view["clients"]["bob"]["blocks"] == view["kv"]["used_blocks"] > 50
                assert alices_view() == before
                break


async def chunked(data: bytes):
    """`data` sent as a chunked body: no Content-Length, so the door counts."""
    for i in range(0, len(data), 65536):
        yield data[i : i + 65536]


def test_a_refused_body_is_an_answer_every_client_can_read(open_server, keyed):
    """The server used to answer 413 and close while the client was still sending: the async
    OpenAI client saw APIConnectionError (after uploading 5 MB three times), async httpx a
    ReadError. The door now drops the rest of the body before it answers."""
    import openai

    url = open_server

    async def main() -> None:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused")  # (it retries)
        with pytest.raises(openai.APIStatusError) as e:
            await client.completions.create(
                model="minivtc-tiny", prompt="x" * 5_000_000, max_tokens=1
            )
        assert e.value.status_code == 413 and "--max-body-bytes" in str(e.value), e.value
        await client.close()
        headers = {"content-type": "application/json"}
        async with httpx.AsyncClient(timeout=60) as http:
            for size in (6_000_000, 10_500_000, 20_000_000):
                big = b'{"prompt": "' + b"x" * size + b'"}'
                r = await http.post(url + "/v1/completions", content=big, headers=headers)
                assert openai_error(r, 413)["code"] == "request_too_large"
                r = await http.post(url + "/v1/completions", content=chunked(big), headers=headers)
                assert openai_error(r, 413)["code"] == "request_too_large"  # no Content-Length
            stranger = {**headers, "Authorization": "Bearer sk-not-a-key"}
            r = await http.post(keyed + "/v1/completions", content=big, headers=stranger)
            assert openai_error(r, 401)["code"] == "invalid_api_key"

    asyncio.run(main())
    assert httpx.get(url + "/health").status_code == 200


@pytest.mark.slow
def test_slow_clients_are_cut_off_and_connections_are_capped(bundled):
    """300 connections sending partial heads or bodies once held the server for 60 s. Now, with a
    1 s head deadline, a 1 s body deadline and at most 20 connections: 30 trickling heads make
    the server answer 503 beyond 20 until the deadline closes them all; a body that stops
    half-way gets 408; then the server serves as before."""
    import socket

    from minivtc.serving.connections import Limits

    model, tokenizer = bundled
    engine = build_engine(model, tokenizer, "vtc", kv_tokens=1024)
    limits = Limits(header_timeout_s=1.0, body_timeout_s=1.0, max_connections=20)
    with BackgroundServer(make_app(engine, tokenizer, limits=limits)) as url:
        host, port = url.removeprefix("http://").split(":")
        slow = [socket.create_connection((host, int(port))) for _ in range(30)]
        started = time.monotonic()
        for s in slow:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n")  # and never the rest
        assert httpx.get(url + "/health").status_code == 503  # uvicorn's limit_concurrency
        for s in slow:
            s.settimeout(5)
            assert s.recv(1) == b"", "the server should close a connection that sends no head"
            s.close()
        closed_after = time.monotonic() - started
        assert httpx.get(url + "/health").status_code == 200
        with socket.create_connection((host, int(port))) as s:
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n{"prompt": '
            )
            s.settimeout(5)
            answer = b"".join(iter(lambda: s.recv(65536), b"")).decode()  # until it closes
        assert answer.startswith("HTTP/1.1 408") and "--body-timeout" in answer, answer
        body = {"prompt": "x", "max_tokens": 2}
        assert httpx.post(url + "/v1/completions", json=body, timeout=30).status_code == 200
    print(f"\n30 connections sending no head: all closed after {closed_after:.2f} s")
    assert closed_after < 4


def test_one_client_holding_its_share_of_requests_cannot_lock_the_others_out(bundled):
    """Issue: the connection cap was global, so one client's open streams could fill it and the
    server answered everyone 503. Now each client may hold `max_client_requests` requests in
    flight. "flood" opens six slow streams (it never reads them, so each stays open whatever
    the machine's speed) against a limit of four and a connection cap of six (uvicorn serves
    five at once), which flood alone would fill: its fifth and sixth get 429 (and it closes
    them), and "light" is still admitted and served while flood's four are open. When flood
    goes away what its requests held is given back."""
    import socket

    from minivtc.serving.connections import Limits

    model, tokenizer = bundled
    engine = build_engine(model, tokenizer, "vtc", kv_tokens=8192, check_invariants=True)
    limits = Limits(max_connections=6, max_client_requests=4)
    slow = {"prompt": "A", "max_tokens": 1500, "ignore_eos": True, "stream": True, "logprobs": 5}
    payload = json.dumps(slow).encode()
    with BackgroundServer(make_app(engine, tokenizer, limits=limits)) as url:
        host, port = url.removeprefix("http://").split(":")
        streams, answers = [], []
        for _ in range(6):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a slow reader
            s.connect((host, int(port)))
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nX-Client-Id: flood\r\n"
                b"Content-Type: application/json\r\n"
                + f"Content-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            s.settimeout(30)
            answers.append(s.recv(4096).decode("latin-1"))  # the head and a first chunk
            if answers[-1].startswith("HTTP/1.1 200"):
                streams.append(s)
            else:
                s.close()
        deadline = time.monotonic() + 30
        while httpx.get(url + "/health").status_code != 200:  # the refused ones closed
            assert time.monotonic() < deadline, "the refused connections were never closed"
            time.sleep(0.05)
        statuses = [a.split(" ", 2)[1] for a in answers]
        assert statuses == ["200"] * 4 + ["429"] * 2, statuses
        assert "too_many_requests_in_flight" in answers[-1], answers[-1]
        assert "--max-client-requests" in answers[-1]
        started = time.monotonic()
        light = httpx.post(
            url + "/v1/completions",
            json={"prompt": "A", "max_tokens": 4, "ignore_eos": True},
            headers={"X-Client-Id": "light"},
            timeout=60,
        )
        waited = time.monotonic() - started
        assert light.status_code == 200, light.text
        assert light.json()["usage"]["completion_tokens"] == 4
        for s in streams:
            s.close()
        again = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the server notices the closed sockets
            again = httpx.post(
                url + "/v1/completions",
                json={"prompt": "A", "max_tokens": 2},
                headers={"X-Client-Id": "flood"},
                timeout=60,
            )
            if again.status_code == 200:
                break
            time.sleep(0.1)
        assert again is not None and again.status_code == 200, again and again.text
    print(f"\nlight served in {waited:.2f} s while flood held four open streams")


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"max_body_bytes": 100}, "--max-body-bytes must be >= 1024"),
        ({"header_timeout_s": 0}, "--header-timeout must be seconds > 0"),
        ({"body_timeout_s": float("inf")}, "--body-timeout must be seconds > 0"),
        ({"body_timeout_s": float("nan")}, "--body-timeout must be seconds > 0"),
        ({"max_connections": 0}, "--max-connections must be >= 1"),
        ({"max_client_requests": 0}, "--max-client-requests must be >= 1"),
    ],
)
def test_limits_refuse_what_cannot_work(options, why):
    from minivtc.serving.connections import Limits

    with pytest.raises(ValueError, match=why):
        Limits(**options)


def test_tokenize_goes_through_the_same_door_as_v1(open_server, bundled):
    """`/tokenize` once skipped `/v1`'s checks (a 4 MB prompt or 80,001 messages
    froze `/health` for 10-12 s) and decoded every token whether asked or not. Now: the
    message count and the text's length are refused unread, a prompt longer than one request
    may hold is a 400 as at `/v1`, and each token's text only when `return_token_strs`."""
    url, (_, tokenizer) = open_server, bundled
    r = httpx.post(url + "/tokenize", content=many_messages(), timeout=60)
    assert openai_error(r, 400)["code"] == "context_length_exceeded"
    long_text = "a" * 3_000_000  # over any 2048 tokens' characters, under the body limit
    r = httpx.post(url + "/tokenize", json={"prompt": long_text}, timeout=60)
    assert openai_error(r, 400)["code"] == "context_length_exceeded"
    words = " ".join(["word"] * 3000)  # fits in characters, not in 2048 tokens
    r = httpx.post(url + "/tokenize", json={"prompt": words}, timeout=60)
    assert openai_error(r, 400)["code"] == "context_length_exceeded"
    plain = httpx.post(url + "/tokenize", json={"prompt": "A list is"}).json()
    assert plain["tokens"] == tokenizer.encode("A list is") and plain["token_strs"] is None
    asked = {"prompt": "A list is", "return_token_strs": True}
    pieces = httpx.post(url + "/tokenize", json=asked).json()["token_strs"]
    assert pieces == [tokenizer.decode([t], skip_special_tokens=False) for t in plain["tokens"]]


def test_tokenize_works_off_the_event_loop(bundled):
    """Every tokenizer call `/tokenize` makes runs on a worker thread, never on the event
    loop (where it stalled every other stream)."""
    from fastapi.testclient import TestClient

    model, tokenizer = bundled
    app = make_app(build_engine(model, tokenizer, "vtc", kv_tokens=256), tokenizer)
    on_loop: list[bool] = []

    class Watched:
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def encode(self, *args, **kwargs):
            on_loop.append(running_loop())
            return tokenizer.encode(*args, **kwargs)

        def decode(self, *args, **kwargs):
            on_loop.append(running_loop())
            return tokenizer.decode(*args, **kwargs)

    app.state.minivtc.tokenizer = Watched()
    with TestClient(app) as client:
        asked = {"prompt": "A list is", "return_token_strs": True}
        assert client.post("/tokenize", json=asked).status_code == 200
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        assert client.post("/tokenize", json=chat).status_code == 200
        assert client.post("/detokenize", json={"tokens": [100, 200]}).status_code == 200
    assert on_loop and not any(on_loop), on_loop


def running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize(
    "template, why",
    [
        ("{{ 'x' * 10**8 }}", "characters"),  # 100 MB in 1.2 s, before
        ("{% for m in messages %}{{ m['content'] * 100000 }}{% endfor %}", "characters"),
        ("{{ 'x'.ljust(10**8) }}", "called a function"),
        ("{% for i in range(20000) %}{% for j in range(20000) %}{% endfor %}{% endfor %}", "took"),
        ("{% include 'x.jinja' %}", "failed on these messages"),  # a 500, before
        ("{% for i in range(10**9) %}{% endfor %}", "called a function"),  # a 500, before
    ],
)
def test_a_chat_template_has_a_time_and_a_size_cap(bundled, template, why):
    """Issue: a template's render had no cap (`'x' * 10**8` made 100 MB, nested
    `range(20000)` ran 12.6 s), `{% include %}` and `range(10**9)` raised errors the chat
    route answered with 500, and the rendered text was tokenized whole before any length
    check. Now a render stops past one request's characters or `MAX_RENDER_S`, and every
    failure is a 400, before any tokenizing."""
    from fastapi.testclient import TestClient

    from minivtc.model import chat

    model, tokenizer = bundled
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match=why):
        chat.prompt_ids(tokenizer, messages, template, max_chars=100_000)
    app = make_app(build_engine(model, tokenizer, "vtc", kv_tokens=256), tokenizer)
    app.state.minivtc.chat_template = template
    with TestClient(app) as client:
        r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    assert openai_error(r, 400)["param"] == "messages"


def test_a_keyless_server_answers_no_web_page_of_another_site(open_server):
    """Issue: without keys, no Host check (a page on another origin could read
    `/dashboard/data` by DNS rebinding), a cross-site `text/plain` POST ran a completion,
    `/fairness` and `/metrics` answered a caller whose X-Forwarded-For was not loopback while
    `/dashboard/data` refused it, and the dashboard had no CSP or frame headers. Now each is
    refused, and the dashboard may not be framed."""
    url = open_server
    rebound = httpx.get(url + "/dashboard/data", headers={"host": "evil.example:8000"})
    assert openai_error(rebound, 403)["code"] == "host_not_allowed"
    body = json.dumps({"prompt": "x", "max_tokens": 1})
    form = httpx.post(url + "/v1/completions", content=body, headers={"content-type": "text/plain"})
    assert openai_error(form, 415)["message"].startswith("send the body as JSON")
    far = {"x-forwarded-for": "203.0.113.5"}
    for path in ("/fairness", "/metrics", "/dashboard/data"):
        assert openai_error(httpx.get(url + path, headers=far), 403)["type"] == "permission_error"
        assert httpx.get(url + path).status_code == 200, path
    page = httpx.get(url + "/dashboard")
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    ok = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=60)
    assert ok.status_code == 200


def test_a_large_response_is_built_off_the_event_loop_and_capped(open_server, bundled, monkeypatch):
    """Issue: a 155-byte chat request (n=16, top_logprobs=20, 768 tokens) made a 17.8 MB
    response, built on the event loop: `/health` blocked 9.2 s. Now completions x tokens x
    logprobs is capped (a 400 before any work), and a whole response is built and serialized
    on a worker thread."""
    from fastapi.testclient import TestClient

    from minivtc.serving import streaming

    body = {"prompt": "x", "max_tokens": 1000, "n": 4, "logprobs": 20}
    r = httpx.post(open_server + "/v1/completions", json=body, timeout=120)
    assert openai_error(r, 400)["param"] == "top_logprobs"
    model, tokenizer = bundled
    app = make_app(build_engine(model, tokenizer, "vtc", kv_tokens=256), tokenizer)
    on_loop: list[bool] = []
    format_logprobs = streaming.format_logprobs

    def watched(*args, **kwargs):
        on_loop.append(running_loop())
        return format_logprobs(*args, **kwargs)

    monkeypatch.setattr(streaming, "format_logprobs", watched)
    with TestClient(app) as client:
        small = {"prompt": "x", "max_tokens": 3, "n": 2, "logprobs": 2}
        answer = client.post("/v1/completions", json=small)
    assert answer.status_code == 200 and len(answer.json()["choices"]) == 2
    assert on_loop and not any(on_loop), on_loop


def test_the_foreground_server_sets_aside_what_startup_made(monkeypatch):
    """Issue: a started gateway holds ~200,000 objects (the modules, torch's among them), and
    each of the collector's full passes walked them all on the event loop: 120 ms on an idle
    core, 290 ms under 200 streams, and `/health` answered that late. Now what startup made is
    frozen before uvicorn serves, so a full pass walks only what serving makes."""
    import gc

    from fastapi import FastAPI

    from minivtc.serving.connections import Limits
    from minivtc.serving.hosting import Foreground

    app = FastAPI()
    app.state.minivtc = type("Setup", (), {"limits": Limits()})()
    foreground = Foreground(app, "127.0.0.1", 0, 1.0, give_up=lambda: None)
    made = len(gc.get_objects())  # (tracked by the collector, the frozen ones aside)
    seen: dict[str, int] = {}

    def serve() -> None:  # (instead of uvicorn's: what the collector holds when serving starts)
        seen["frozen"], seen["walked"] = gc.get_freeze_count(), len(gc.get_objects())

    monkeypatch.setattr(foreground.server, "run", serve)
    try:
        foreground.run()
    finally:
        gc.unfreeze()  # (this test process goes on collecting as before)
    assert seen["frozen"] >= made // 2, seen
    assert seen["walked"] < made // 10, (seen, made)


def test_a_request_without_a_body_passes_the_door_in_the_same_turn_of_the_event_loop():
    """Issue: the door read every body under `asyncio.wait_for`, a GET `/health`'s (none) too;
    its task costs two more turns of the event loop, and under 200 streams through the
    gateway each turn waited behind a batch of their chunks (`/health` up to 233 ms, 112
    without). A head that announces no body now passes without waiting for a turn; a body,
    Content-Length or chunked, keeps its deadline (408)."""
    from minivtc.serving.api_keys import Auth
    from minivtc.serving.connections import InFlight, Limits
    from minivtc.serving.middleware import GuardMiddleware
    from minivtc.serving.openai_api import APIError

    door = GuardMiddleware(None, Auth(None), Limits(body_timeout_s=0.05), InFlight(8))
    scope = {"type": "http", "path": "/health", "client": ("127.0.0.1", 5), "headers": []}

    async def no_body():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def first_step() -> object:
        step = door.admit(scope, {"host": "127.0.0.1:8000"}, no_body)
        try:
            step.send(None)
        except StopIteration as done:
            return done.value
        step.close()
        return "waited for a turn of the event loop"

    assert asyncio.run(first_step()) == b""

    async def never():  # a body announced, and never sent
        await asyncio.sleep(3600)

    for announced in ({"content-length": "5"}, {"transfer-encoding": "chunked"}):
        refusal = asyncio.run(door.admit(scope, announced, never))
        assert isinstance(refusal, APIError) and refusal.status == 408, announced
