"""`minivtc serve` started as `vllm serve` is: positional MODEL / --model, --api-key,
--served-model-name, --max-model-len, --max-num-seqs, --enable-prefix-caching, --dtype auto,
--chat-template; the model's id is the served name, else the path as given."""

from __future__ import annotations

import argparse

import httpx
import pytest

from minivtc.cli.serve import add_serve
from minivtc.model.weights import BUNDLED_WEIGHTS
from minivtc.serving.vllm_flags import VLLMServe
from tests.conftest import start_serve

openai = pytest.importorskip("openai")
TEMPLATE = "{{ bos_token }}{% for m in messages %}[{{ m['content'] }}]{% endfor %}"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


@pytest.mark.parametrize(
    "argv, checkpoint, name, aliases",
    [
        ((), None, "minivtc-tiny", ()),
        (("weights",), "weights", "weights", ()),  # the path as given
        (("--model", "./weights/"), "./weights/", "./weights/", ()),
        (("--weights", "w", "--served-model-name", "a", "b"), "w", "a", ("b",)),
    ],
)
def test_the_model_and_its_id(argv, checkpoint, name, aliases):
    got = VLLMServe.of(parse(*argv))
    assert (got.checkpoint, got.name, got.aliases) == (checkpoint, name, aliases)


@pytest.mark.parametrize(
    "argv, message",
    [
        (("a", "--model", "b"), "name one checkpoint"),
        (("--tensor-parallel-size", "2"), "one device"),
        (("--api-key", "k", "--api-keys", "f.json"), "not both"),
    ],
)
def test_flags_that_cannot_hold_together_are_refused(argv, message):
    with pytest.raises(ValueError, match=message):
        VLLMServe.of(parse(*argv))


def test_api_key_is_not_taken_for_api_keys():
    args = parse("--api-key", "sk-test-key")
    assert args.api_key == "sk-test-key" and args.api_keys is None
    [(key, entry)] = VLLMServe.of(args).keys.items()
    assert key == "sk-test-key" and entry.admin and entry.proxy


@pytest.mark.slow
def test_serve_as_vllm_serve_is_started(tmp_path):
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE)
    options = [
        str(BUNDLED_WEIGHTS),
        "--api-key",
        "sk-test-key",
        "--served-model-name",
        "llama-tiny",
    ]
    options += ["--max-model-len", "512", "--max-num-seqs", "8", "--enable-prefix-caching"]
    options += ["--dtype", "auto", "--chat-template", str(template), "--kv-tokens", "2048"]
    server, url = start_serve(*options)
    try:
        sdk = openai.OpenAI(base_url=url + "/v1", api_key="sk-test-key", max_retries=0)
        assert [m.id for m in sdk.models.list().data] == ["llama-tiny"]
        out = sdk.completions.create(model="llama-tiny", prompt="A list", max_tokens=4)
        assert out.usage.completion_tokens == 4
        chat = [{"role": "user", "content": "hi"}]
        auth = {"Authorization": "Bearer sk-test-key"}
        tokens = httpx.post(url + "/tokenize", json={"messages": chat}, headers=auth).json()
        assert tokens["max_model_len"] == 512
        plain = httpx.post(url + "/tokenize", json={"prompt": "[hi]"}, headers=auth).json()
        assert tokens["tokens"] == plain["tokens"]  # the template: "<s>[hi]"
        reply = sdk.chat.completions.create(model="llama-tiny", messages=chat, max_tokens=3)
        assert reply.usage.prompt_tokens == tokens["count"]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
        too_long = {"model": "llama-tiny", "prompt": "x", "max_tokens": 600}
        assert httpx.post(url + "/v1/completions", json=too_long, headers=auth).status_code == 400
    finally:
        server.terminate()
        server.wait(timeout=30)
