"""Shared fixtures: tiny random Llama checkpoints written by `transformers`, the bundled model."""

from __future__ import annotations

import os
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


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`-n`), each worker takes its share of the cores for torch's threads,
    and so do the servers, lessons and graders it starts (OMP_NUM_THREADS is inherited): two
    workers with a team of OpenMP threads each, spinning on the same cores, would be slower
    than one. A thread count the caller set is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


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


def start_serve(*options: str, compiled: bool = False):
    """`minivtc serve` as a user starts it, on a free port, once /health answers: (the process,
    its URL). The caller ends the process. `--enforce-eager` unless `compiled`: the tests of
    what a server does need no compile at its start (`tests/test_compiled.py` has the one that
    serves compiled)."""
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "minivtc.cli.main", "serve", "--port", str(port), *options]
    command += [] if compiled else ["--enforce-eager"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + (240 if compiled else 60)
    while True:
        assert server.poll() is None, server.stderr.read()
        try:
            if httpx.get(url + "/health").status_code == 200:
                return server, url
        except httpx.ConnectError:
            pass
        assert time.monotonic() < deadline, "the server did not come up in time"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def redis_url():
    """A Redis server of the test's own on a free loopback port, with a password:
    `redis://:PASSWORD@127.0.0.1:PORT/0` (the gateways' shared store; `.ci/run` installs
    Debian's redis-server). Stopped at the end of the module."""
    import socket
    import subprocess
    import time

    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    password = "test-store-password"
    args = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
    args += ["no", "--requirepass", password]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    yield f"redis://:{password}@127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)
