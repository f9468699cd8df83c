"""Graded runs forked from a warm process: the grader's own checks, fast.

Owns `run_pytest`, which runs pytest in a child forked from this process, the scratch package
first on its path: the child drops every `minivtc` module it inherited, so it imports the
scratch copy afresh, while torch, transformers, hypothesis and pytest (seconds to import) are
already loaded (`preload`). Used by `check.py` (the catalogue of wrong solutions and the
mutation run), which grades hundreds of submissions; `minivtc course grade` uses a fresh
process per assignment. POSIX only (os.fork). Call it from a process that has run no torch
work yet: a fork copies no threads.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

__all__ = ["parallel_map", "preload", "run_pytest"]


def preload() -> None:
    """Import the heavy libraries the graded tests use, once, before forking."""
    import hypothesis  # noqa: F401
    import pytest  # noqa: F401
    import torch  # noqa: F401

    try:
        from transformers.models.llama import modeling_llama  # noqa: F401
    except ImportError:
        pass  # a1's tests skip without transformers


def run_pytest(args: list[str], root: Path, log: Path, time_limit_s: float) -> bool:
    """pytest with `args` in a forked child, in `root`, its output to `log`; True: it was
    killed at the time limit."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 70
        try:
            code = child(args, root, log)
        finally:
            os._exit(code)
    deadline = time.monotonic() + time_limit_s
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return False
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return True


def child(args: list[str], root: Path, log: Path) -> int:
    sink = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(sink, 1)
    os.dup2(sink, 2)
    os.chdir(root)
    sys.path.insert(0, str(root))
    for name in [m for m in sys.modules if m == "minivtc" or m.startswith("minivtc.")]:
        del sys.modules[name]  # the scratch copy, afresh
    import pytest

    code = int(pytest.main(args))
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def parallel_map(fn, items: list, jobs: int) -> list:
    """[fn(x) for x in items] in `jobs` forked workers (each item's result JSON-able); each
    worker takes every jobs-th item and forks its own graded runs in turn."""
    if jobs <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    import json
    import tempfile

    with tempfile.TemporaryDirectory(prefix="minivtc-workers-") as scratch:
        pids = []
        for j in range(jobs):
            out = Path(scratch) / f"{j}.json"
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                code = 70
                try:
                    out.write_text(json.dumps([fn(x) for x in items[j::jobs]]))
                    code = 0
                except BaseException:
                    import traceback

                    traceback.print_exc()
                finally:
                    os._exit(code)
            pids.append(pid)
        for pid in pids:
            os.waitpid(pid, 0)
        parts = [json.loads((Path(scratch) / f"{j}.json").read_text()) for j in range(jobs)]
    results = [None] * len(items)
    for j, part in enumerate(parts):
        results[j::jobs] = part
    return results
