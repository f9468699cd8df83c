"""Shared fixtures: tiny random Llama checkpoints written by `transformers`, the bundled model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from minivtc.model.config import LlamaConfig
from minivtc.model.weights import BUNDLED_WEIGHTS

# Two tiny shapes: multi-head attention, and grouped-query attention (2 query heads per KV head).
TINY_MHA = LlamaConfig(
    vocab_size=4096,
    dim=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=4,
    ffn_dim=96,
    max_positions=256,
    rope_theta=10000.0,
)
TINY_GQA = LlamaConfig(
    vocab_size=4096,
    dim=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    ffn_dim=96,
    max_positions=256,
    rope_theta=500000.0,
)


def write_hf_checkpoint(config: LlamaConfig, path: Path, seed: int = 0) -> Path:
    """A random `LlamaForCausalLM` saved with `save_pretrained` (safetensors), plus a tokenizer."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    hf_config = transformers.LlamaConfig(
        **{k: v for k, v in config.to_hf().items() if k != "architectures"}
    )
    model = transformers.LlamaForCausalLM(hf_config).eval()
    model.save_pretrained(path, safe_serialization=True)
    shutil.copy(BUNDLED_WEIGHTS / "tokenizer.model", path / "tokenizer.model")
    return path


@pytest.fixture(params=[TINY_MHA, TINY_GQA], ids=["mha", "gqa"])
def hf_checkpoint(request, tmp_path) -> Path:
    return write_hf_checkpoint(request.param, tmp_path / "ckpt")


@pytest.fixture(scope="session")
def bundled():
    """The bundled model (fp32) and its tokenizer, loaded once per test session."""
    from minivtc.model.weights import load_model

    return load_model()


def start_serve(*options: str):
    """`minivtc serve` as a user starts it, on a free port, once /health answers: (the process,
    its URL). The caller ends the process."""
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "minivtc.cli.main", "serve", "--port", str(port), *options]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert server.poll() is None, server.stderr.read()
        try:
            if httpx.get(url + "/health").status_code == 200:
                return server, url
        except httpx.ConnectError:
            pass
        assert time.monotonic() < deadline, "the server did not come up in 60 s"
        time.sleep(0.2)
