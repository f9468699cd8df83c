"""The server end to end: the real `openai` client, bad input, disconnects, load, fairness.

Every test talks HTTP to a real uvicorn server on the bundled model. The engine runs with
`check_invariants=True`, so a broken pool or scheduler kills the engine loop and `/health`
answers 503 — which every test checks at its end.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import httpx
import pytest

from minivtc.engine.engine import Engine
from minivtc.engine.factory import build_engine
from minivtc.engine.sampler import SamplingParams
from minivtc.offline.llm import LLM
from minivtc.requests.params import DEFAULT_MAX_TOKENS, resolve_max_tokens
from minivtc.serving.hosting import BackgroundServer
from minivtc.serving.prompts import SMALL_BODY_BYTES, off_loop_if_large
from minivtc.serving.server import make_app
from minivtc.sim.workloads import TraceRequest

openai = pytest.importorskip("openai")

POOL_TOKENS = 1024  # below the context (2048), so "longer than the pool" is its own error


@dataclass
class Live:
    url: str
    engine: Engine  # owned by the engine thread: tests read it through /fairness only
    tokenizer: object


def start(bundled, scheduler: str, kv_tokens: int = POOL_TOKENS):
    model, tokenizer = bundled
    engine = build_engine(model, tokenizer, scheduler, kv_tokens=kv_tokens, check_invariants=True)
    return BackgroundServer(make_app(engine, tokenizer)), engine


@pytest.fixture(scope="module")
def server(bundled):
    background, engine = start(bundled, "vtc")
    with background as url:
        yield Live(url, engine, bundled[1])
        assert httpx.get(url + "/health").status_code == 200, "the engine loop died"


def client(live: Live, **options) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, **options)


def wait_until_idle(url: str, timeout: float = 10.0) -> dict:
    """Poll /fairness until nothing runs or waits and every block is free; return the view."""
    deadline = time.monotonic() + timeout
    while True:
        view = httpx.get(url + "/fairness").json()
        busy = any(c["running"] or c["waiting"] for c in view["clients"].values())
        if not busy and view["kv"]["used_blocks"] == 0:
            return view
        assert time.monotonic() < deadline, f"the server did not go idle: {view}"
        time.sleep(0.05)


# --- the OpenAI API --------------------------------------------------------------------------


def test_completions_match_the_offline_engine_streamed_or_not(server):
    prompt, n = "The function returns", 12
    offline = LLM(policy="fcfs").generate(prompt, SamplingParams(temperature=0, max_tokens=n))
    api = client(server)
    whole = api.completions.create(model="minivtc-tiny", prompt=prompt, max_tokens=n, temperature=0)
    assert whole.choices[0].text == offline[0].text
    assert whole.choices[0].finish_reason in ("length", "stop")
    assert whole.usage.prompt_tokens == len(server.tokenizer.encode(prompt))
    assert whole.usage.completion_tokens == len(offline[0].token_ids)
    chunks = list(
        api.completions.create(
            model="minivtc-tiny",
            prompt=prompt,
            max_tokens=n,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in text_chunks) == offline[0].text
    assert len(text_chunks) == len(offline[0].token_ids), "one chunk per generated token"
    assert chunks[-1].usage.completion_tokens == len(offline[0].token_ids)
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_chat_streamed_and_not_with_usage(server):
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What does len() return?"},
    ]
    api = client(server)
    whole = api.chat.completions.create(
        model="minivtc-tiny",
        messages=messages,
        max_tokens=10,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.prompt_tokens == len(server.tokenizer.chat_ids(messages))
    assert whole.usage.completion_tokens == 10
    chunks = list(
        api.chat.completions.create(
            model="minivtc-tiny",
            messages=messages,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 10


def test_a_request_without_max_tokens_runs_to_the_one_rules_default(bundled):
    """A completion without max_tokens gets OpenAI's 16 tokens; a chat, the room its prompt
    leaves in the context and the pool, as the engine resolves None (`resolve_max_tokens`)."""
    pool = 64
    background, _ = start(bundled, "vtc", kv_tokens=pool)
    with background as url:
        body = {"prompt": "Once", "ignore_eos": True}
        done = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
        assert done["usage"]["completion_tokens"] == DEFAULT_MAX_TOKENS
        body = {"messages": [{"role": "user", "content": "hi"}], "ignore_eos": True}
        usage = httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()["usage"]
        room = pool - usage["prompt_tokens"]
        assert usage["completion_tokens"] == resolve_max_tokens(None, room) == room > 16


def test_models_health_metrics_and_fairness_view(server):
    models = client(server).models.list()
    assert [m.id for m in models.data] == ["minivtc-tiny"]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    client(server).completions.create(
        model="minivtc-tiny",
        prompt="x",
        max_tokens=3,
        extra_headers={"X-Client-Id": "metrics-check"},
    )
    text = httpx.get(server.url + "/metrics").text
    assert 'minivtc_client_output_tokens_total{client="metrics-check"}' in text
    assert 'minivtc_time_to_first_token_seconds_bucket{le="+Inf"}' in text
    assert "minivtc_kv_blocks_total 64" in text  # 1024 tokens / 16 per block
    view = wait_until_idle(server.url)
    me = view["clients"]["metrics-check"]
    assert me["service"] == me["input_tokens"] + 2 * me["output_tokens"]
    assert me["counter"] > 0 and me["weight"] == 1.0


def test_client_identity_header_then_user_then_default(server):
    api = client(server)
    api.completions.create(
        model="minivtc-tiny",
        prompt="a",
        max_tokens=2,
        user="by-user",
        extra_headers={"X-Client-Id": "by-header"},
    )
    api.completions.create(model="minivtc-tiny", prompt="a", max_tokens=2, user="by-user")
    clients = wait_until_idle(server.url)["clients"]
    assert clients["by-header"]["output_tokens"] >= 1
    assert clients["by-user"]["output_tokens"] >= 1


# --- bad input: a clear 4xx, and nobody else notices -------------------------------------------

TOO_LONG_FOR_CONTEXT = [1] + [200] * 2100
TOO_LONG_FOR_POOL = [1] + [200] * 1500  # fits the 2048 context, not the 1024-token pool

IMAGE_CHAT = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}
BAD_INPUT = [  # (what, path, raw body, status, param)
    ("malformed JSON", "/v1/completions", b'{"prompt": "x",', 400, None),
    ("prompt of the wrong type", "/v1/completions", {"prompt": 5}, 400, "prompt"),
    (
        "max_tokens as a string",
        "/v1/completions",
        {"prompt": "x", "max_tokens": "5"},
        400,
        "max_tokens",
    ),
    ("unknown field", "/v1/completions", {"prompt": "x", "best_effort": True}, 400, "best_effort"),
    ("missing prompt", "/v1/completions", {"max_tokens": 5}, 400, "prompt"),
    ("max_tokens = 0", "/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens < 0", "/v1/completions", {"prompt": "x", "max_tokens": -3}, 400, "max_tokens"),
    (
        "max_tokens beyond the context",
        "/v1/completions",
        {"prompt": "x", "max_tokens": 5000},
        400,
        "max_tokens",
    ),
    (
        "prompt longer than the context",
        "/v1/completions",
        {"prompt": TOO_LONG_FOR_CONTEXT},
        400,
        "prompt",
    ),
    (
        "prompt longer than the KV pool",
        "/v1/completions",
        {"prompt": TOO_LONG_FOR_POOL},
        400,
        "prompt",
    ),
    ("empty prompt", "/v1/completions", {"prompt": []}, 400, "prompt"),
    ("token id outside the vocabulary", "/v1/completions", {"prompt": [1, 99999]}, 400, "prompt"),
    ("unknown model", "/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404, "model"),
    ("n > 16", "/v1/completions", {"prompt": "x", "n": 17}, 400, "n"),
    ("n x prompts > 16", "/v1/completions", {"prompt": ["x"] * 4, "n": 5}, 400, "n"),
    ("temperature > 2", "/v1/completions", {"prompt": "x", "temperature": 3}, 400, "temperature"),
    ("top_p = 0", "/v1/completions", {"prompt": "x", "top_p": 0}, 400, "top_p"),
    ("empty stop sequence", "/v1/completions", {"prompt": "x", "stop": [""]}, 400, "stop"),
    ("logprobs > 20", "/v1/completions", {"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    (
        "min_tokens > max_tokens",
        "/v1/completions",
        {"prompt": "x", "max_tokens": 2, "min_tokens": 3},
        400,
        "min_tokens",
    ),
    ("an image part", "/v1/chat/completions", IMAGE_CHAT, 400, "messages.0.content.0.type"),
    ("chat without messages", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    (
        "chat ending with the assistant",
        "/v1/chat/completions",
        {"messages": [{"role": "assistant", "content": "hi"}]},
        400,
        "messages",
    ),
    (
        "chat with an unknown role",
        "/v1/chat/completions",
        {"messages": [{"role": "robot", "content": "hi"}]},
        400,
        "messages.0.role",
    ),
]


def test_bad_input_gets_an_openai_error_and_a_concurrent_request_completes(server):
    done = {}

    def well_formed() -> None:  # streams 64 tokens while the bad requests arrive
        chunks = client(server).completions.create(
            model="minivtc-tiny",
            prompt="The class",
            max_tokens=64,
            stream=True,
            extra_body={"ignore_eos": True},
            extra_headers={"X-Client-Id": "bystander"},
        )
        done["tokens"] = sum(1 for _ in chunks)

    bystander = threading.Thread(target=well_formed)
    bystander.start()
    for what, path, body, status, param in BAD_INPUT:
        if isinstance(body, bytes):
            r = httpx.post(
                server.url + path, content=body, headers={"content-type": "application/json"}
            )
        else:
            r = httpx.post(server.url + path, json=body)
        assert r.status_code == status, f"{what}: {r.status_code} {r.text}"
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, what
        assert error["param"] == param, f"{what}: param {error['param']!r} ({error['message']})"
        assert error["message"], what
    bystander.join(timeout=60)
    assert done.get("tokens") == 64, "the well-formed request was disturbed"
    wait_until_idle(server.url)


def test_openai_client_raises_its_named_errors(server):
    api = client(server)
    with pytest.raises(openai.BadRequestError, match="context"):
        api.completions.create(model="minivtc-tiny", prompt="x", max_tokens=5000)
    with pytest.raises(openai.NotFoundError):
        api.completions.create(model="nope", prompt="x")


def test_rpm_rejection_is_429(bundled):
    background, _ = start(bundled, "rpm:2")
    with background as url:
        api = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        for _ in range(2):
            api.completions.create(model="minivtc-tiny", prompt="x", max_tokens=2, user="eager")
        with pytest.raises(openai.RateLimitError, match="in the last 60 s"):
            api.completions.create(model="minivtc-tiny", prompt="x", max_tokens=2, user="eager")
        api.completions.create(model="minivtc-tiny", prompt="x", max_tokens=2, user="patient")


# --- disconnects --------------------------------------------------------------------------------


def test_disconnect_mid_stream_aborts_and_frees_the_blocks(server):
    body = {"prompt": "The module", "max_tokens": 900, "stream": True, "ignore_eos": True}
    with httpx.stream(
        "POST", server.url + "/v1/completions", json=body, headers={"X-Client-Id": "leaver"}
    ) as r:
        lines = r.iter_lines()
        got = [line for line, _ in zip(lines, range(6), strict=False) if line.startswith("data:")]
        assert got, "no chunk arrived"
        view = httpx.get(server.url + "/fairness").json()
        assert view["kv"]["used_blocks"] > 0, "the request should hold blocks while streaming"
    view = wait_until_idle(server.url, timeout=5)  # long before 900 tokens could finish
    assert view["clients"]["leaver"]["output_tokens"] < 900


def test_disconnect_while_waiting_for_a_whole_completion_aborts_it(server):
    body = {"prompt": "The module", "max_tokens": 900, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.url + "/v1/completions",
            json=body,
            timeout=0.5,
            headers={"X-Client-Id": "impatient"},
        )
    view = wait_until_idle(server.url, timeout=5)
    assert view["clients"]["impatient"]["output_tokens"] < 900


# --- load and fairness over HTTP ----------------------------------------------------------------


def test_100_concurrent_streaming_clients(server):
    n, max_tokens = 100, 16
    health: list[int] = []

    async def one(api, i: int):
        stream = await api.completions.create(
            model="minivtc-tiny",
            prompt=f"Request {i}:",
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
            extra_headers={"X-Client-Id": f"load-{i:03d}"},
        )
        ids, usage, tokens = set(), None, 0
        async for chunk in stream:
            ids.add(chunk.id)
            tokens += bool(chunk.choices)
            usage = chunk.usage or usage
        return ids, tokens, usage.completion_tokens

    async def watch(stop: asyncio.Event):
        async with httpx.AsyncClient() as http:
            while not stop.is_set():
                health.append((await http.get(server.url + "/health")).status_code)
                await asyncio.sleep(0.2)

    async def main():
        api = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(stop))
        results = await asyncio.gather(*(one(api, i) for i in range(n)))
        stop.set()
        await watcher
        return results

    start_s = time.monotonic()
    results = asyncio.run(main())
    wall = time.monotonic() - start_s
    ids = [next(iter(r[0])) for r in results]
    assert all(len(r[0]) == 1 for r in results), "a stream mixed chunks of two requests"
    assert len(set(ids)) == n, "a request was duplicated or lost"
    assert all(r[1] == max_tokens and r[2] == max_tokens for r in results)
    assert health and set(health) == {200}, f"/health during the load: {health}"
    clients = wait_until_idle(server.url)["clients"]
    assert all(clients[f"load-{i:03d}"]["output_tokens"] == max_tokens for i in range(n))
    print(
        f"\n100 concurrent streams x {max_tokens} tokens: {wall:.1f} s, "
        f"{n * max_tokens / wall:.0f} tokens/s, /health polled {len(health)} times"
    )


def behind_a_flood(bundled, scheduler: str) -> tuple[int, int]:
    """Forty flood requests fill the server (8 run at once; their lengths differ, so slots free
    one at a time); once the server has all forty, runs 7 or 8 and reports at least 16 waiting,
    a light client sends one request. Returns how many flood requests were waiting then and how
    many of those got their first token before the light request: an order the scheduler
    decides, however fast or loaded this machine is, since the light request is sent when the
    server says the flood waits, not at a time."""
    background, _ = start(bundled, scheduler, kv_tokens=8 * 48)
    prompt = [1] + [100 + i for i in range(7)]
    first_token: dict[str, float] = {}

    async def one(http: httpx.AsyncClient, name: str, client: str, max_tokens: int):
        body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
        headers = {"X-Client-Id": client}
        async with http.stream("POST", "/v1/completions", json=body, headers=headers) as reply:
            assert reply.status_code == 200, await reply.aread()
            async for line in reply.aiter_lines():
                if line.startswith("data: {") and '"text"' in line:
                    first_token.setdefault(name, time.monotonic())

    async def flood(http: httpx.AsyncClient) -> tuple[int, int, int]:
        """The flood's requests waiting, running and dispatched (each dispatched one's 8 prompt
        tokens counted in its input_tokens), as the server reports them."""
        row = (await http.get("/fairness")).json()["clients"].get("flood", {})
        dispatched = row.get("input_tokens", 0) // len(prompt)
        return row.get("waiting", 0), row.get("running", 0), dispatched

    async def main() -> tuple[int, int]:
        async with httpx.AsyncClient(base_url=url, timeout=None) as http:
            names = [f"flood-{i}" for i in range(40)]
            floods = [
                asyncio.create_task(one(http, name, "flood", 32 + i % 9))
                for i, name in enumerate(names)
            ]
            while True:
                waiting, running, dispatched = await flood(http)
                if waiting >= 16 and running >= 7 and waiting + dispatched == len(names):
                    break
                await asyncio.sleep(0.005)
            await one(http, "light", "light", 8)
            await asyncio.gather(*floods)
        ahead = sum(first_token[name] < first_token["light"] for name in names)
        return waiting, ahead - dispatched

    with background as url:
        return asyncio.run(main())


@pytest.mark.slow
def test_a_flood_delays_a_light_client_under_fcfs_not_under_vtc(bundled):
    """FCFS serves the light request after every flood request waiting before it; VTC lifts the
    light client to the flood's counter (Algorithm 2's lift) and, the flood's counter rising with
    each token it generates, admits the light request at the next free slot: at most the few flood
    requests admitted while it crossed HTTP into the engine, or won a tie, go first."""
    fcfs_waiting, fcfs_ahead = behind_a_flood(bundled, "fcfs")
    vtc_waiting, vtc_ahead = behind_a_flood(bundled, "vtc")
    print(
        f"\nflood requests waiting when the light request was sent / served before it: "
        f"FCFS {fcfs_waiting} / {fcfs_ahead}, VTC {vtc_waiting} / {vtc_ahead}"
    )
    assert fcfs_ahead >= fcfs_waiting - 3, "FCFS let the light request pass the waiting flood"
    assert vtc_ahead <= 3, "VTC served the waiting flood before the light client"


# --- generated input (schemathesis): never a 5xx ----------------------------------------------


def test_generated_requests_never_get_a_5xx(bundled):
    """Requests generated from the server's own OpenAPI schema, valid and not, to every route.

    The pool caps generations at ~250 tokens so that the valid cases finish quickly."""
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    background, _ = start(bundled, "vtc", kv_tokens=256)
    statuses: dict[int, int] = {}
    with background as url:
        schema = schemathesis.openapi.from_url(url + "/openapi.json")
        operations = [op.ok().as_strategy() for op in schema.get_all_operations()]

        @given(case=st.one_of(operations))
        @settings(
            max_examples=50, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        def check(case):
            response = case.call(base_url=url, timeout=60)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            assert response.status_code < 500, f"{case.as_curl_command()}\n{response.text[:300]}"

        check()
        assert httpx.get(url + "/health").status_code == 200
    assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 0, statuses


def test_a_dead_engine_loop_answers_500_then_503(bundled):
    class Broken:
        def run(self, requests, allocator):
            raise RuntimeError("boom: the forward pass failed")

        def release(self, request):
            pass

    background, engine = start(bundled, "fcfs")
    engine.runner = Broken()
    with background as url:
        r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 4})
        assert r.status_code == 500 and "boom" in r.json()["error"]["message"]
        health = httpx.get(url + "/health")
        assert health.status_code == 503 and "boom" in health.json()["message"]
        r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 4})
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
        assert httpx.get(url + "/fairness").status_code == 503
        assert httpx.get(url + "/metrics").status_code == 503


def test_loadgen_command_records_every_request(bundled, tmp_path, capsys):
    """c0's requests share a 40-token prefix: the server's prefix cache finds its first two
    blocks of 16 in every c0 request after the first, and requests.csv records them."""
    from minivtc.cli.main import main
    from minivtc.sim.metrics import read_requests
    from minivtc.sim.workloads import write_trace

    trace = [TraceRequest(f"c{i % 3}", 0.1 * i, 8, 6) for i in range(1, 12) if i % 3]
    trace += [TraceRequest("c0", 0.6 * i, 48, 6, None, "system", 40) for i in range(4)]
    write_trace(tmp_path / "trace.csv", trace)
    model, tokenizer = bundled
    engine = build_engine(
        model, tokenizer, "vtc", kv_tokens=POOL_TOKENS, prefix_caching=True, check_invariants=True
    )
    background = BackgroundServer(make_app(engine, tokenizer))
    with background as url:
        code = main(
            [
                "loadgen",
                "--url",
                url,
                "--trace",
                str(tmp_path / "trace.csv"),
                "--speedup",
                "2",
                "--out",
                str(tmp_path / "out"),
            ]
        )
    assert code == 0
    served = read_requests(tmp_path / "out" / "requests.csv")
    assert sorted((r.client, r.output_tokens) for r in served) == sorted(
        (t.client, 6) for t in trace
    )
    assert max(r.arrival_s for r in served) < 0.1 * 11 / 2 + 0.5  # sent at trace time / speedup
    assert sorted(r.cached_tokens for r in served) == [0] * 9 + [32] * 3
    assert (tmp_path / "out" / "service.png").stat().st_size > 0
    assert "served" in capsys.readouterr().out


def test_a_small_body_is_parsed_on_the_event_loop_and_a_large_one_on_a_worker():
    """A body of a few hundred bytes (nearly every request) costs less to parse than two
    hand-offs between threads; a large one must never hold the event loop (other streams)."""

    async def where(size: int) -> threading.Thread:
        return await off_loop_if_large(size, threading.current_thread)

    here = threading.current_thread()
    assert asyncio.run(where(SMALL_BODY_BYTES)) is here
    assert asyncio.run(where(SMALL_BODY_BYTES + 1)) is not here
