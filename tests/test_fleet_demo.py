"""`minivtc demo --replicas N` (gateway/demo_replicas.py): the demo's table with one column per
run, through the gateway and a round-robin router, on short requests, a capacity given (no
calibration) and backends in this process, so that it runs in seconds; the round-robin order of
the load generator over several servers."""

from __future__ import annotations

import contextlib
import json

import pytest
from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.responses import StreamingResponse

from minivtc.cli.main import main
from minivtc.engine.factory import build_engine
from minivtc.gateway import demo_replicas
from minivtc.model.weights import load_model
from minivtc.serving import demo
from minivtc.serving.connections import Limits
from minivtc.serving.hosting import BackgroundServer
from minivtc.serving.loadgen import run_replay
from minivtc.serving.server import make_app
from minivtc.sim.workloads import TraceRequest


@contextlib.contextmanager
def in_process_backends(n: int):
    """`demo_replicas.backends` in this process, on one loaded model (the demo runs them as
    `minivtc serve` processes; starting those is most of a short run)."""
    model, tokenizer = load_model()
    kv_tokens = demo.BATCH * (demo.INPUT_TOKENS + demo.OUTPUT_TOKENS)
    with contextlib.ExitStack() as stack:
        engines = [build_engine(model, tokenizer, "vtc", kv_tokens=kv_tokens) for _ in range(n)]
        yield [stack.enter_context(BackgroundServer(make_app(e, tokenizer))) for e in engines]


@pytest.mark.slow
def test_two_backends_behind_the_gateway_and_round_robin_print_one_table(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(demo, "OUTPUT_TOKENS", 4)  # short requests: seconds, not minutes
    monkeypatch.setattr(demo_replicas, "calibrate", lambda tokenizer, replicas: 3.0)
    monkeypatch.setattr(demo_replicas, "backends", in_process_backends)
    rows = demo_replicas.main(tmp_path, duration=2.0, drain=30.0, replicas=2)
    plan = demo.plan_for(3.0, 2.0)
    for client in ("heavy", "light"):
        sent = sum(t.client == client for t in plan.trace)
        assert sent > 0
        # every request sent was served, both ways, with no failure
        assert rows[f"{client}: finished / sent"] == {
            "GATEWAY": f"{sent} / {sent}",
            "ROUND-ROBIN": f"{sent} / {sent}",
        }
    assert rows["cancelled at the end"] == {"GATEWAY": "0", "ROUND-ROBIN": "0"}
    printed = capsys.readouterr().out
    assert "GATEWAY" in printed and "ROUND-ROBIN" in printed
    assert (tmp_path / "demo.md").read_text().strip() == printed.strip()
    for name in ("demo.png", "requests_gateway.csv", "requests_round-robin.csv"):
        assert (tmp_path / name).stat().st_size > 0


def test_the_round_robin_baseline_aliases_light_requests_onto_one_replica():
    """The workload's arrivals repeat heavy, heavy, light, heavy: with two replicas, every
    light request is an even one in arrival order (the docstring's "what to expect")."""
    trace = demo.plan_for(10.0, 30.0).trace
    light = {k % 2 for k, t in enumerate(trace) if t.client == "light"}
    assert light == {0}


def recording_backend(seen: list[str]) -> FastAPI:
    """A stand-in that streams one token and its usage, and records who sent each request."""
    app = FastAPI()

    async def completions(http: HTTPRequest):
        seen.append(http.headers["x-client-id"])
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        chunks = [{"choices": [{"index": 0, "text": "a"}]}, {"choices": [], "usage": usage}]
        lines = [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]
        return StreamingResponse(iter(lines), media_type="text/event-stream")

    app.post("/v1/completions")(completions)
    app.state.minivtc = type("S", (), {"limits": Limits()})()
    return app


def test_the_load_generator_sends_round_robin_over_several_servers_in_arrival_order():
    seen: list[list[str]] = [[], []]
    trace = [TraceRequest(f"c{k}", 0.01 * k, 3, 1) for k in range(7)]
    with BackgroundServer(recording_backend(seen[0])) as a:
        with BackgroundServer(recording_backend(seen[1])) as b:
            result = run_replay([a, b], trace, progress=False)
    assert len(result.served) == 7 and not result.failed
    assert sorted(seen[0]) == ["c0", "c2", "c4", "c6"] and sorted(seen[1]) == ["c1", "c3", "c5"]
    with pytest.raises(ValueError, match="at least one URL"):
        run_replay([], trace, progress=False)


@pytest.mark.parametrize("replicas", ["1", "0"])
def test_a_fleet_demo_needs_two_backends(replicas, tmp_path, capsys):
    code = main(["demo", "--replicas", replicas, "--out", str(tmp_path), "--duration", "1"])
    assert code == 2
    assert "--replicas must be >= 2" in capsys.readouterr().err
