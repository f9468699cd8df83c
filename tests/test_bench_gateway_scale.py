"""`minivtc bench gateways` (`bench/gateway_scale.py`) at its smallest: it starts a store, a
stand-in backend and k = 1, 2 gateways, drives a few streams through them and prints one row
per k and what each process used. Its output's shape is checked, never its speed."""

from __future__ import annotations

import re
import shutil

import pytest

from minivtc.bench.suite import main

NUMBER = r"\d+(\.\d+)?"


def test_its_help_says_what_it_measures(capsys):
    with pytest.raises(SystemExit):
        main(["gateways", "--help"])
    out = capsys.readouterr().out
    assert "--gateways" in out and "--streams" in out and "commandstats" in out
    with pytest.raises(SystemExit):
        main(["gateways", "--gateways", "1,two"])
    assert "--gateways: whole numbers" in capsys.readouterr().err


def test_a_tiny_run_prints_a_row_per_k_and_each_process_cpu(capsys):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    args = ["--gateways", "1,2", "--streams", "4", "--seconds", "1", "--backends", "1"]
    assert main(["gateways", *args, "--warmup", "0.3"]) == 0
    out, err = capsys.readouterr()
    assert "k = 2: starting 2 gateway(s)" in err  # progress
    lines = out.splitlines()
    assert re.match(r"machine: \d+ cores", lines[0])
    rows = [line.split() for line in lines if re.match(r"\s+[12]\s+\d", line)]
    speed, cpu = rows[:2], rows[2:]
    assert [r[0] for r in speed] == ["1", "2"] and [r[0] for r in cpu] == ["1", "2"]
    for row in speed:  # k, streams/s, tokens/s, vs k=1, / k, trips/req, cmds/req, errors
        assert all(re.fullmatch(NUMBER, x) for x in row[:8]), row
        assert row[7] == "0" and float(row[1]) > 0 and float(row[5]) >= 2  # book + release
    assert speed[0][3] == "1.00"
    assert len(cpu[0]) == 1 + 1 + 4 and len(cpu[1]) == 1 + 2 + 4  # one column per gateway
