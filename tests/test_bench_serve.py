"""`minivtc bench serve` at its smallest: guidellm against `minivtc serve`, and the engine alone;
the table's shape and the line that compares one stream with the engine (never a speed)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from minivtc.model.weights import bundled_weights_dir


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("guidellm") is None, reason="needs guidellm")
def test_bench_serve_prints_a_row_per_stream_count(tmp_path):
    command = [sys.executable, "-m", "minivtc", "bench", "serve", "--streams", "1,2"]
    command += ["--rounds", "1", "--requests", "1", "--new-tokens", "4", "--vllm-python", ""]
    command += ["--weights", str(bundled_weights_dir()), "--enforce-eager"]  # (no compile)
    env = {k: v for k, v in os.environ.items() if k != "MINIVTC_VLLM_PYTHON"}  # minivtc alone
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("machine: ") and "CPUs" in lines[0]
    header = next(i for i, line in enumerate(lines) if line.startswith("| streams |"))
    assert "minivtc tok/s" in lines[header] and "failed, minivtc" in lines[header]
    rows = [line.split(" | ") for line in lines[header + 2 : header + 4]]
    assert [row[0] for row in rows] == ["| 1", "| 2"]
    assert all(row[-1] == "0 |" for row in rows), rows  # no request failed
    compared = "one stream through minivtc's server / its engine offline at batch 1"
    assert any(line.startswith(compared) for line in lines)
    cpu = lines.index("one stream, the server's CPU per output token (ms, median of the rounds):")
    assert lines[cpu + 1].startswith("  minivtc: ") and "minivtc-http" in lines[cpu + 1]
    assert (tmp_path / "bench-serve-minivtc.log").exists()


def test_stream_counts_are_checked_where_they_are_read(capsys):
    import argparse

    from minivtc.bench.serve_http import main
    from minivtc.bench.timing import counts

    assert counts("1,16,64") == [1, 16, 64]
    for bad in ("1,x", "0", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            counts(bad)
        with pytest.raises(SystemExit):  # refused with a message, before any server starts
            main(["--streams", bad])
        assert "whole numbers >= 1 joined by commas" in capsys.readouterr().err
