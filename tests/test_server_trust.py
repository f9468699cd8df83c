"""The server under attack and abuse: one bad request never takes it down.

Each test starts a real uvicorn server on the bundled model (the engine with
`check_invariants=True`) and checks that a bystander is served exactly as before and that the
pool returns to fully free.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from minivtc.llm import build_engine
from minivtc.server import BackgroundServer, make_app
from minivtc.tokenizer import Tokenizer
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
    model, tokenizer = bundled
    tok = PoisonedTokenizer(_model_file(tokenizer))
    engine = build_engine(model, tok, "vtc", kv_tokens=1024, check_invariants=True)
    with BackgroundServer(make_app(engine, tok)) as url:
        yield url
        assert httpx.get(url + "/health").status_code == 200, "the engine loop died"


def _model_file(tokenizer):
    from minivtc.weights import BUNDLED_WEIGHTS

    return BUNDLED_WEIGHTS / "tokenizer.model"


def stream_events(url: str, body: dict) -> list[dict | str]:
    events = []
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True},
                      timeout=60) as r:  # fmt: skip
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_an_out_of_range_seed_is_a_400_and_the_engine_serves_on(poisoned):
    for seed in (18446744073709551616, -1, 2**63):
        r = httpx.post(poisoned + "/v1/completions",
                       json={"prompt": "x", "max_tokens": 2, "seed": seed})  # fmt: skip
        assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.text
    r = httpx.post(poisoned + "/v1/completions",
                   json={"prompt": "x", "max_tokens": 2, "seed": 2**63 - 1})  # fmt: skip
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
