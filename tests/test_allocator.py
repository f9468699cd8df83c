"""The allocator `minivtc serve` and the benchmarks start their engines on
(`serving/allocator.py`): which library "auto" picks, the user's choice kept, and a process
started with a preload really running on that allocator, computing the same tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from minivtc.cli.main import main
from minivtc.serving import allocator
from minivtc.serving.allocator import ALLOCATORS, describe, name_of, preload_for, restart_on

LINUX_X86 = sys.platform == "linux" and os.uname().machine == "x86_64"


class Restarted(Exception):
    """What the stand-in for `os.execve` raises: the process would have been replaced."""


def execve(path, command, env):
    raise Restarted(path, command, env)


@pytest.mark.skipif(sys.platform != "linux", reason="preloading is for Linux")
def test_serve_restarts_itself_on_tcmalloc_where_installed(monkeypatch):
    monkeypatch.setattr(allocator.os, "execve", execve)
    monkeypatch.setattr(allocator.ctypes.util, "find_library", lambda name: f"lib{name}.so.4")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    with pytest.raises(Restarted) as restarted:
        restart_on(["serve", "--port", "8001"])
    path, command, env = restarted.value.args
    assert path == sys.executable and command[1:] == ["-m", "minivtc", "serve", "--port", "8001"]
    assert env["LD_PRELOAD"] == "libtcmalloc_minimal.so.4"
    # the user's preload, even an empty one (glibc's malloc chosen), is left as it is
    for chosen in ("", "/opt/libjemalloc.so"):
        monkeypatch.setenv("LD_PRELOAD", chosen)
        restart_on(["serve"])


@pytest.mark.skipif(sys.platform != "linux", reason="preloading is for Linux")
@pytest.mark.parametrize("command", [["serve", "--port", "8001"], ["demo", "--duration", "6"]])
def test_the_commands_that_serve_restart_from_the_command_line(monkeypatch, command):
    """`minivtc serve` and `minivtc demo` (the README's first command), typed at a shell."""
    monkeypatch.setattr(allocator.os, "execve", execve)
    monkeypatch.setattr(allocator.ctypes.util, "find_library", lambda name: f"lib{name}.so.4")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.setattr(sys, "argv", ["minivtc", *command])
    monkeypatch.setenv("OMP_PROC_BIND", "true")  # (serve binds its threads first: kept as it is)
    with pytest.raises(Restarted) as restarted:
        main()
    _, argv, env = restarted.value.args
    assert argv[1:] == ["-m", "minivtc", *command]
    assert env["LD_PRELOAD"] == "libtcmalloc_minimal.so.4"


@pytest.mark.skipif(not LINUX_X86, reason="the tbb wheel is for x86-64 Linux")
def test_without_tcmalloc_it_restarts_on_the_tbb_wheels_allocator(monkeypatch):
    """The `tbb` wheel is a dependency on x86-64 Linux: a fresh install has a fast allocator."""
    monkeypatch.setattr(allocator.os, "execve", execve)
    monkeypatch.setattr(allocator.ctypes.util, "find_library", lambda name: None)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    with pytest.raises(Restarted) as restarted:
        restart_on(["serve"])
    preload = restarted.value.args[2]["LD_PRELOAD"]
    libraries = preload.split(" ")
    assert [os.path.basename(p) for p in libraries] == list(allocator.TBB_LIBRARIES)
    assert all(os.path.isfile(p) for p in libraries)
    assert preload_for("auto") == preload_for("tbbmalloc") == preload
    assert describe({"LD_PRELOAD": preload}).startswith("oneTBB's scalable allocator")


def test_with_neither_the_server_starts_as_it_is_and_says_how_to_get_one(monkeypatch):
    monkeypatch.setattr(allocator.os, "execve", execve)
    monkeypatch.setattr(allocator.ctypes.util, "find_library", lambda name: None)
    monkeypatch.setattr(allocator, "tbbmalloc", lambda: None)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    restart_on(["serve"])  # no restart
    assert preload_for("auto") == ""
    hint = describe(os.environ)
    assert hint.startswith("glibc malloc: install TCMalloc") and "pip install tbb" in hint
    assert describe({"LD_PRELOAD": ""}) == "glibc malloc"  # chosen, so no hint
    assert describe({"LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4"}).startswith("TCMalloc")
    assert name_of("/opt/libjemalloc.so") == "LD_PRELOAD=/opt/libjemalloc.so"
    with pytest.raises(ValueError, match="not installed here"):
        preload_for("tbbmalloc")
    with pytest.raises(ValueError, match="one of auto, tcmalloc, tbbmalloc, glibc"):
        preload_for("jemalloc")
    assert preload_for("glibc") == "" and ALLOCATORS[0] == "auto"


RUN = textwrap.dedent(
    """
    import json
    import torch
    from minivtc.offline.llm import LLM
    from minivtc.requests.params import SamplingParams
    llm = LLM(dtype="float32")
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = llm.generate(["A module is", "The list"], params, use_tqdm=False)
    with open("/proc/self/maps") as maps:
        mapped = sorted({line.split("/")[-1].strip() for line in maps if "malloc" in line})
    print(json.dumps({"tokens": [o.outputs[0].token_ids for o in outs], "mapped": mapped}))
    """
)


@pytest.mark.skipif(not LINUX_X86, reason="the tbb wheel is for x86-64 Linux")
def test_an_engine_preloaded_with_tbbs_allocator_runs_on_it_and_computes_the_same_tokens():
    def run(preload: str) -> dict:
        env = dict(os.environ, LD_PRELOAD=preload)
        done = subprocess.run(
            [sys.executable, "-c", RUN], capture_output=True, text=True, env=env, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        answer: dict = json.loads(done.stdout.splitlines()[-1])
        return answer

    glibc, tbb = run(preload_for("glibc")), run(preload_for("tbbmalloc"))
    assert not any("tbbmalloc" in name for name in glibc["mapped"])
    assert {"libtbbmalloc.so.2", "libtbbmalloc_proxy.so.2"} <= set(tbb["mapped"])
    assert tbb["tokens"] == glibc["tokens"] and len(tbb["tokens"][0]) == 12
