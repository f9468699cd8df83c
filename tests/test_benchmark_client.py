"""A benchmark client of the vLLM ecosystem, unchanged, against the server: GuideLLM (the vLLM
project's load generator, `guidellm run`), over completions and chat, streaming (its default,
with vLLM's `stream_options.continuous_usage_stats`, `ignore_eos` and, for chat, content as a
list of text parts). Every request must succeed, with the token counts it asked for and the
prompt's tokens as this server counts them.

GuideLLM makes its synthetic prompts with the model's Hugging Face tokenizer, which it loads
from the model id: the server serves the bundled model under its path (vLLM's default id), and
`transformers` reads that directory's tokenizer.model. Skipped where GuideLLM is not installed
(`pip install -e .[dev]` installs it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from minivtc.engine.factory import build_engine
from minivtc.model.weights import BUNDLED_WEIGHTS
from minivtc.serving.hosting import BackgroundServer
from minivtc.serving.server import make_app

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("guidellm") is None, reason="guidellm is not installed"
)
OUTPUT_TOKENS = 6


@pytest.fixture(scope="module")
def served(bundled):
    model, tokenizer = bundled
    engine = build_engine(model, tokenizer, "vtc", kv_tokens=4096, check_invariants=True)
    with BackgroundServer(make_app(engine, tokenizer, str(BUNDLED_WEIGHTS))) as url:
        yield url, tokenizer


def guidellm(url: str, route: str, out, requests: int) -> list[dict]:
    """`guidellm run` as its README shows it, 4 requests at a time; its per-request records."""
    backend = f"kind=openai_http,target={url},model={BUNDLED_WEIGHTS},request_format={route}"
    command = [sys.executable, "-m", "guidellm", "run", "--backend", backend]
    command += ["--profile", "kind=concurrent,streams=4"]
    command += [
        "--constraint",
        f"kind=max_requests,count={requests}",
        "--tokenizer",
        "kind=hf_auto",
    ]
    command += ["--data", f"kind=synthetic_text,prompt_tokens=24,output_tokens={OUTPUT_TOKENS}"]
    command += ["--output", f"kind=json,path={out}", "--disable-console"]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}  # nothing from a hub
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    [benchmark] = json.loads(out.read_text())["benchmarks"]
    records = benchmark["requests"]
    assert (len(records["errored"]), len(records["incomplete"])) == (0, 0), records["errored"]
    assert len(records["successful"]) == requests
    return records["successful"]


@pytest.mark.slow
def test_guidellm_completions_streaming(served, tmp_path):
    url, tokenizer = served
    for record in guidellm(url, "/v1/completions", tmp_path / "out.json", requests=8):
        body = json.loads(record["request_args"])["body"]
        assert body["stream"] and body["stream_options"]["continuous_usage_stats"]
        assert record["output_tokens"] == OUTPUT_TOKENS
        assert record["prompt_tokens"] == len(tokenizer.encode(body["prompt"]))


@pytest.mark.slow
def test_guidellm_chat_streaming(served, tmp_path):
    url, tokenizer = served
    for record in guidellm(url, "/v1/chat/completions", tmp_path / "out.json", requests=8):
        body = json.loads(record["request_args"])["body"]
        messages = [{"role": m["role"], "content": m["content"]} for m in body["messages"]]
        assert isinstance(messages[0]["content"], list)  # text parts, as current clients send
        text = [{"role": "user", "content": messages[0]["content"][0]["text"]}]
        assert record["output_tokens"] == OUTPUT_TOKENS
        assert record["prompt_tokens"] == len(tokenizer.chat_ids(text))
