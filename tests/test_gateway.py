"""`minivtc route` in front of two real `minivtc serve` backends on loopback: streams passed
through and charged, the server's own 4xx rules, a flooding and a light tenant, a backend that
refuses (given back, uncharged) and one killed mid-stream (only its requests end)."""

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

from minivtc.fairness.vtc import VTC
from minivtc.fleet.backend import Backend
from minivtc.gateway.app import make_gateway
from minivtc.gateway.gateway import Gateway
from minivtc.gateway.proxy import backends_of
from minivtc.model.tokenizer import Tokenizer
from minivtc.model.weights import bundled_weights_dir
from minivtc.serving.api_keys import Auth, Key
from minivtc.serving.connections import Limits
from minivtc.serving.hosting import BackgroundServer

BUDGET = 256  # tokens per backend: two requests of 100 output tokens each
KEYS = {
    f"sk-{name}": Key(name, admin=name == "ops")
    for name in ["first", "heavy", "light", "victim", "ops", "picky", "later", "vllm", "chat"]
} | {"sk-proxy-key": Key("proxy", proxy=True), "sk-jose-key": Key("José")}
ADMIN = {"authorization": "Bearer sk-ops"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def backends():
    """Two `minivtc serve` processes on the bundled model, VTC each, 256 KV tokens each."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ports = [free_port(), free_port()]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "minivtc",
                "serve",
                "--port",
                str(p),
                "--kv-tokens",
                str(BUDGET),
                "--enforce-eager",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for p in ports
    ]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    deadline = time.monotonic() + 90
    for url in urls:
        while not healthy(url):
            assert time.monotonic() < deadline, "a backend did not start"
            time.sleep(0.2)
    yield list(zip(urls, procs, strict=True))
    for proc in procs:
        proc.kill()
        proc.wait()


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def gateway_over(backends: list[Backend]) -> Gateway:
    tokenizer = Tokenizer(bundled_weights_dir() / "tokenizer.model")
    return Gateway(VTC(), backends, tokenizer, "minivtc-tiny", Auth(KEYS), health_every_s=0.2)


@pytest.fixture(scope="module")
def gateway(backends):
    """The gateway in process, its budgets read from the backends' /fairness."""
    app = make_gateway(gateway_over(backends_of([url for url, _ in backends])))
    with BackgroundServer(app) as url:
        yield url


def stream(
    url: str, key: str, max_tokens: int, timeout: float = 60, **extra
) -> tuple[list[dict], float]:
    """A streamed completion of exactly `max_tokens` tokens (EOS ignored: sampled at the
    default temperature, a story may end early): its events, and the seconds to the first.
    `key` "client:NAME" names the client in X-Client-Id instead (a backend without keys).
    `timeout`: the longest wait for the answer or its next chunk."""
    body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True}
    body |= {"ignore_eos": True, **extra}
    start, first, events = time.monotonic(), None, []
    headers = {"authorization": f"Bearer {key}"}
    if key.startswith("client:"):
        headers = {"x-client-id": key.removeprefix("client:")}
    post = {"json": body, "headers": headers, "timeout": timeout}
    with httpx.stream("POST", url + "/v1/completions", **post) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                first = first or time.monotonic() - start
                events.append(json.loads(line[5:]))
    return events, first


def fleet(url: str) -> dict:
    return httpx.get(url + "/fairness", headers=ADMIN).json()


@pytest.mark.slow
def test_a_stream_passes_through_chunk_by_chunk_and_is_charged_by_its_usage(gateway):
    events, _ = stream(gateway, "sk-first", 6, stream_options={"include_usage": True})
    tokens = [e for e in events if e["choices"]]
    assert len(tokens) == 6 and tokens[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 6
    before = fleet(gateway)["clients"]["first"]["counter"]
    events, _ = stream(gateway, "sk-first", 3, stream_options={"include_usage": True})
    view = fleet(gateway)
    # w_p per prompt token, w_q per output token, as the backend's usage says (the client was
    # the last to leave the queue: rejoining, it is not lifted)
    usage = events[-1]["usage"]
    assert view["clients"]["first"]["counter"] - before == usage["prompt_tokens"] + 2 * 3
    assert all(b["reserved"] == 0 for b in view["backends"])
    assert [b["budget"] for b in view["backends"]] == [BUDGET, BUDGET]  # read from /fairness
    assert view["bound"] == 2 * max(BUDGET - 1, 2 * 2 * BUDGET)  # 2U, M = both budgets
    events, _ = stream(gateway, "sk-first", 3)
    assert all(e["choices"] for e in events)  # no usage chunk unless asked for


def test_bad_input_gets_the_servers_own_answer(gateway):
    post = lambda body, key="sk-first": httpx.post(  # noqa: E731
        gateway + "/v1/completions", json=body, headers={"authorization": f"Bearer {key}"}
    )
    r = post({"prompt": "x", "temperature": 5})
    assert r.status_code == 400 and "invalid value for 'temperature'" in r.text
    assert post({"prompt": "x"}, key="sk-nobody").status_code == 401
    r = post({"prompt": "x", "max_tokens": BUDGET})
    assert r.status_code == 400 and "fits no backend" in r.text
    assert (
        httpx.get(gateway + "/metrics", headers={"authorization": "Bearer sk-first"}).status_code
        == 403
    )
    text = httpx.get(gateway + "/metrics", headers=ADMIN).text
    assert "minivtc_gateway_backend_budget_tokens{backend=" in text and f"{BUDGET}.0" in text


def test_the_openai_client_chats_through_the_gateway_and_each_reply_is_charged(gateway):
    from openai import OpenAI

    api = OpenAI(base_url=gateway + "/v1", api_key="sk-chat", max_retries=0)
    messages = [{"role": "user", "content": "What is a tuple?"}]
    reply = api.chat.completions.create(model="minivtc-tiny", messages=messages, max_tokens=5)
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason in ("length", "stop")
    assert 1 <= reply.usage.completion_tokens <= 5
    before = fleet(gateway)["clients"]["chat"]["counter"]  # (lifted when it first joined)
    chunks = list(
        api.chat.completions.create(
            model="minivtc-tiny",
            messages=messages,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert any(c.choices and c.choices[0].delta.content for c in chunks)
    usage = chunks[-1].usage
    assert usage is not None and 1 <= usage.completion_tokens <= 4
    assert usage.prompt_tokens == reply.usage.prompt_tokens  # the same messages
    view = fleet(gateway)
    # the last to leave the queue, it rejoins unlifted: w_p per prompt token, w_q per output
    assert view["clients"]["chat"]["counter"] - before == (
        usage.prompt_tokens + 2 * usage.completion_tokens
    )
    assert all(b["reserved"] == 0 for b in view["backends"])


HEAVY_TOKENS = 200  # one heavy request fills a backend's 256 tokens: one at a time each


async def burst(heavy_at, light_at, heavy: int = 8, light: int = 3) -> dict[str, list[float]]:
    """`heavy` streams at once, then `light` short ones one after another; each one's time to
    first token. `heavy_at(i)`, `light_at(i)`: (url, key) of request i."""
    loop = asyncio.get_running_loop()
    floods = [loop.run_in_executor(None, stream, *heavy_at(i), HEAVY_TOKENS) for i in range(heavy)]
    await asyncio.sleep(0.5)  # the flood fills both backends and queues
    light_ttft = []
    for i in range(light):
        _, ttft = await loop.run_in_executor(None, stream, *light_at(i), 4)
        light_ttft.append(ttft)
    heavy_ttft = [ttft for _, ttft in await asyncio.gather(*floods)]
    return {"heavy": sorted(heavy_ttft), "light": light_ttft}


@pytest.mark.slow
def test_a_light_tenant_is_served_promptly_beside_a_flooding_one(gateway, backends):
    """Heavy's eight streams take both backends (one each) and six wait; the light tenant's
    requests each go first as soon as a backend frees, ahead of heavy's queue. Beside it, the
    same load sent round-robin straight to the backends, each with its own VTC: printed, for
    the record (a flood spread evenly is where per-replica VTC is already fair)."""
    ttft = asyncio.run(burst(lambda i: (gateway, "sk-heavy"), lambda i: (gateway, "sk-light")))
    assert len(ttft["light"]) == 3
    assert max(ttft["light"]) < ttft["heavy"][len(ttft["heavy"]) // 2]  # ahead of heavy's median
    view = fleet(gateway)
    assert view["clients"]["light"]["waiting"] == view["clients"]["heavy"]["waiting"] == 0
    assert asyncio.run(abandoned(gateway)) == (True, True)
    urls = [url for url, _ in backends]
    direct = asyncio.run(
        burst(lambda i: (urls[i % 2], "client:heavy"), lambda i: (urls[i % 2], "client:light"))
    )
    print(f"\nTTFT s through the gateway: {rounded(ttft)}")
    print(f"round-robin, per-replica VTC: {rounded(direct)}")


async def until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def abandoned(url: str) -> tuple[bool, bool]:
    """Heavy fills both backends, and two light requests wait behind them at the gateway; the
    caller of one goes away. Returns whether light had both at the gateway (waiting or
    running), then one only."""
    loop = asyncio.get_running_loop()
    floods = [loop.run_in_executor(None, stream, url, "sk-heavy", HEAVY_TOKENS) for _ in range(2)]
    await asyncio.sleep(0.3)
    body = {"prompt": "x", "max_tokens": HEAVY_TOKENS, "stream": True}
    headers = {"authorization": "Bearer sk-light"}
    live = lambda: sum(fleet(url)["clients"]["light"][k] for k in ("waiting", "running"))  # noqa: E731
    async with httpx.AsyncClient() as one, httpx.AsyncClient() as other:
        gone, kept = (
            asyncio.create_task(c.post(url + "/v1/completions", json=body, headers=headers))
            for c in (one, other)  # (light's first 200-token request waits for a backend)
        )
        before = await until(lambda: live() == 2)
        gone.cancel()
        await one.aclose()  # the caller goes away: its connection closes
        after = await until(lambda: live() == 1)
        await kept  # the other is served once heavy's requests end
    await asyncio.gather(*floods)
    return before, after


def rounded(ttft: dict[str, list[float]]) -> dict[str, list[float]]:
    return {k: [round(t, 2) for t in v] for k, v in ttft.items()}


def refusing_backend() -> FastAPI:
    """A stand-in that is healthy but answers every completion 503 (a full vLLM, say)."""
    app = FastAPI()
    app.get("/health")(lambda: {"status": "ok"})
    app.post("/v1/completions")(lambda: JSONResponse({"error": "busy"}, status_code=503))
    app.state.minivtc = type("S", (), {"limits": Limits()})()
    return app


def vllm_like_backend(texts: tuple[str, ...] = ("a", "b", "c")) -> FastAPI:
    """A stand-in speaking vLLM's shapes: text chunks with `stop_reason`, then (asked for) a
    usage chunk with no choices whose prompt count is its own tokenizer's (here 7). Like
    vLLM, it writes raw UTF-8 (no escapes)."""
    app = FastAPI()
    app.get("/health")(lambda: Response())  # vLLM's /health: 200, empty body

    async def completions(http: HTTPRequest):
        body = await http.json()
        head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}

        def chunk(text, finish):
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
            return head | {"choices": [choice]}

        chunks = [chunk(t, None) for t in texts[:-1]] + [chunk(texts[-1], "length")]
        if body.get("stream_options", {}).get("include_usage"):
            usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
            chunks.append(head | {"choices": [], "usage": usage})
        lines = [f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in chunks]
        lines.append("data: [DONE]\n\n")
        return StreamingResponse(iter(lines), media_type="text/event-stream")

    app.post("/v1/completions")(completions)
    app.state.minivtc = type("S", (), {"limits": Limits()})()
    return app


def test_a_backend_speaking_vllms_shapes_is_passed_through_and_settled_by_its_usage():
    with BackgroundServer(vllm_like_backend()) as vllm:
        gw = gateway_over(backends_of([f"{vllm}=1000"]))  # a budget given, not read
        with BackgroundServer(make_gateway(gw)) as url:
            events, _ = stream(url, "sk-vllm", 3)
            view = fleet(url)
    assert [e["choices"][0]["text"] for e in events] == ["a", "b", "c"]  # no usage: not asked
    assert events[0]["choices"][0]["stop_reason"] is None  # vLLM's own fields pass through
    assert view["clients"]["vllm"]["counter"] == 7 + 2 * 3  # its usage, not our tokenizer's
    assert view["backends"][0]["budget"] == 1000


def test_a_chunk_holding_unicode_line_separators_reaches_the_caller_whole():
    """Issue: the gateway split a backend's stream with `splitlines`, so a chunk whose text held
    a raw U+2028 or U+0085 reached the caller cut in two, the rest dropped."""
    texts = ("a", "b\u2028c", "d\u0085e")
    with BackgroundServer(vllm_like_backend(texts)) as vllm:
        gw = gateway_over(backends_of([f"{vllm}=1000"]))
        with BackgroundServer(make_gateway(gw)) as url:
            body = {"prompt": "x", "max_tokens": 3, "stream": True}
            headers = {"authorization": "Bearer sk-vllm"}
            answer = httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=60)
    events = [e for e in answer.content.split(b"\n\n") if e.startswith(b"data: {")]
    assert [json.loads(e[6:])["choices"][0]["text"] for e in events] == list(texts)


def test_client_ids_are_checked_at_the_door_and_unicode_names_reach_the_backends(
    gateway, backends, tmp_path
):
    """Issue: `"user": "eve\\n"` through a proxy key made httpx raise before sending, which the
    gateway took for the backend's refusal (marked down, retried every tick; /health 503);
    "a\\x00b" gave 502; a keys-file tenant "José" or a proxy naming "Zoë" got 500 on every
    request, charged. Now an id that is not printable text is a 400 at the door (the same
    rule as `serve`), nothing is charged and the backends stay up; a Unicode name is carried
    to the backend in the body, whole, and charged there under its own name."""
    proxy = {"authorization": "Bearer sk-proxy-key"}
    before = fleet(gateway)
    for bad in ("eve\n", "a\x00b", "x\u202ey"):
        body = {"prompt": "hi", "max_tokens": 2, "user": bad}
        for stream in (False, True):
            answer = httpx.post(
                gateway + "/v1/completions", json=body | {"stream": stream}, headers=proxy
            )
            assert answer.status_code == 400, (bad, answer.text)
            assert "printable text" in answer.json()["error"]["message"]
    assert all(b["healthy"] for b in fleet(gateway)["backends"])
    assert httpx.get(gateway + "/health").status_code == 200
    assert fleet(gateway)["clients"].keys() == before["clients"].keys()
    for headers, name in ((proxy, "Zoë"), ({"authorization": "Bearer sk-jose-key"}, "José")):
        body = {"prompt": "hi", "max_tokens": 2, "user": name}
        answer = httpx.post(gateway + "/v1/completions", json=body, headers=headers, timeout=60)
        assert answer.status_code == 200, answer.text
        assert fleet(gateway)["clients"][name]["counter"] > 0
        served = [httpx.get(url + "/fairness").json()["clients"] for url, _ in backends]
        assert any(name in rows for rows in served), served
    from minivtc.serving.api_keys import read_keys

    (tmp_path / "keys.json").write_text(json.dumps({"sk-evil-key": {"client": "eve\n"}}))
    with pytest.raises(ValueError, match="printable text only"):
        read_keys(tmp_path / "keys.json")


def test_a_backend_answering_503_gives_the_request_back_uncharged(backends):
    with BackgroundServer(refusing_backend()) as refusing:
        gw = gateway_over([Backend(refusing, BUDGET), Backend(backends[0][0], BUDGET)])
        with BackgroundServer(make_gateway(gw)) as url:
            events, _ = stream(url, "sk-picky", 5, stream_options={"include_usage": True})
            view = fleet(url)
    assert view["requests"]["given_back"] >= 1 and view["requests"]["served"] == 1
    usage = events[-1]["usage"]
    # charged once: what the real backend served, nothing for the refusals
    assert view["clients"]["picky"]["counter"] == usage["prompt_tokens"] + 2 * 5


@pytest.mark.slow
def test_minivtc_route_drains_on_sigterm(backends, tmp_path):
    """The command: budgets read from the backends; on SIGTERM a stream in flight finishes
    whole, then the process exits."""
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"sk-drain": {"client": "drain"}}))
    port = free_port()
    args = [sys.executable, "-m", "minivtc", "route", "--port", str(port), "--api-keys", str(keys)]
    args += [a for url, _ in backends for a in ("--backend", url)]
    proc = subprocess.Popen(args, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while not healthy(url):
        assert time.monotonic() < deadline and proc.poll() is None, "the gateway did not start"
        time.sleep(0.2)
    body = {"prompt": "Once", "max_tokens": 60, "stream": True, "ignore_eos": True}  # 60 whole
    headers = {"authorization": "Bearer sk-drain"}
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=headers) as r:
        lines = (line for line in r.iter_lines() if line.startswith("data:"))
        first = next(lines)
        proc.send_signal(signal.SIGTERM)
        rest = list(lines)
    assert [first, *rest][-1] == "data: [DONE]" and len([first, *rest]) == 61
    # uvicorn re-raises the signal once its graceful shutdown is done: killed by SIGTERM, late
    assert proc.wait(timeout=30) in (0, -signal.SIGTERM)


def test_a_backend_killed_mid_stream_ends_only_its_requests(gateway, backends):
    body = {"prompt": "Once", "max_tokens": 200, "stream": True, "ignore_eos": True}
    headers = {"authorization": "Bearer sk-victim"}
    with httpx.stream("POST", gateway + "/v1/completions", json=body, headers=headers) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        assert json.loads(first[5:])["choices"]
        on = next(b["url"] for b in fleet(gateway)["backends"] if b["running"])
        proc = dict(backends)[on]
        proc.send_signal(signal.SIGKILL)
        rest = [line for line in lines if line.startswith("data:")]
    assert "the backend failed" in rest[-2] and rest[-1] == "data: [DONE]"
    events, _ = stream(gateway, "sk-later", 3)  # the other backend serves what comes next
    assert len(events) == 3
    view = fleet(gateway)
    assert [b["healthy"] for b in view["backends"] if b["url"] == on] == [False]
    assert all(b["reserved"] == 0 for b in view["backends"])


def slow_backend(delay_s: float) -> FastAPI:
    """A stand-in that streams three chunks `delay_s` apart, then its usage: many such streams
    are in flight at once behind a large budget."""
    app = FastAPI()
    app.get("/health")(lambda: Response())

    async def completions(http: HTTPRequest):
        async def lines():
            for k in range(3):
                await asyncio.sleep(delay_s)
                yield f"data: {json.dumps({'choices': [{'index': 0, 'text': str(k)}]})}\n\n"
            usage = {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n"

        return StreamingResponse(lines(), media_type="text/event-stream")

    app.post("/v1/completions")(completions)
    app.state.minivtc = type("S", (), {"limits": Limits()})()
    return app


@pytest.mark.slow
def test_two_hundred_streams_in_flight_leave_the_health_checks_their_own_connections():
    """Issue: the gateway's one HTTP client kept httpx's default pool of 100 connections, shared
    with its health checks (2 s, pool wait included): with 150 streams in flight, 51 waited up
    to 20.9 s, /health answered 503 and every backend was marked dead. Now requests have a
    pool as large as the backends' budgets allow and the checks one of their own: 200 streams
    over two backends are all served, and /health answers 200 throughout."""
    with BackgroundServer(slow_backend(0.5)) as a, BackgroundServer(slow_backend(0.5)) as b:
        gw = gateway_over(backends_of([f"{a}=100000", f"{b}=100000"]))
        with BackgroundServer(make_gateway(gw)) as url:

            async def one(http: httpx.AsyncClient, k: int) -> int:
                body = {"prompt": [1, 2], "max_tokens": 3, "stream": True, "user": f"s{k % 20}"}
                headers = {"authorization": "Bearer sk-proxy-key"}  # a class of 20 students
                async with http.stream("POST", "/v1/completions", json=body, headers=headers) as r:
                    assert r.status_code == 200
                    return sum([line.startswith("data: {") async for line in r.aiter_lines()])

            async def health(http: httpx.AsyncClient, done: asyncio.Event) -> list[int]:
                codes = []
                while not done.is_set():
                    codes.append((await http.get("/health")).status_code)
                    await asyncio.sleep(0.1)
                return codes

            async def run() -> tuple[list[int], list[int]]:
                limits = httpx.Limits(max_connections=None)
                async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
                    done = asyncio.Event()
                    watch = asyncio.create_task(health(http, done))
                    events = await asyncio.gather(*(one(http, k) for k in range(200)))
                    done.set()
                    return list(events), await watch

            events, codes = asyncio.run(run())
    assert events == [3] * 200  # three tokens each (the usage chunk was not asked for)
    assert codes and set(codes) == {200}, codes
