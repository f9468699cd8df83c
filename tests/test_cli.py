"""The command line end to end on the bundled model (and the benchmarks' code paths, briefly)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest

from minivtc.bench import suite as bench
from minivtc.bench import timing as bench_timing
from minivtc.cli.main import main
from minivtc.serving.allocator import name_of, preload_for
from tests.conftest import start_serve


def test_generate_streams_text(capsys):
    assert (
        main(["generate", "--prompt", "The list", "--max-tokens", "12", "--temperature", "0"]) == 0
    )
    out, err = capsys.readouterr()
    assert out.startswith("The list") and len(out.strip()) > len("The list")
    assert "[12 tokens]" in err


def test_generate_is_reproducible_with_a_seed(capsys):
    args = ["generate", "--prompt", "A module", "--max-tokens", "10", "--seed", "7"]
    main(args)
    first = capsys.readouterr().out
    main(args)
    assert capsys.readouterr().out == first


def test_generate_chat_and_stop(capsys):
    main(
        [
            "generate",
            "--chat",
            "--prompt",
            "What is a tuple?",
            "--max-tokens",
            "30",
            "--temperature",
            "0",
            "--stop",
            ".",
        ]
    )
    out = capsys.readouterr().out
    assert "." not in out


def test_generate_rejects_a_bad_weights_dir(tmp_path):
    command = ["generate", "--prompt", "x", "--weights", str(tmp_path)]
    result = subprocess.run(
        [sys.executable, "-m", "minivtc.cli.main", *command], capture_output=True, text=True
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"minivtc generate: error: missing file: {tmp_path}/config.json" in result.stderr


def test_help_explains_every_command():
    """`python -m minivtc` is the `minivtc` command."""
    result = subprocess.run(
        [sys.executable, "-m", "minivtc", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0
    for command in (
        "demo",
        "generate",
        "serve",
        "loadgen",
        "simulate",
        "reproduce",
        "bench",
        "course",
    ):
        assert command in result.stdout


@pytest.mark.slow
def test_demo_runs_fcfs_then_vtc_and_writes_its_table_and_plot(tmp_path, capsys):
    """A 6-second demo: both tables, each run's verdict, the server's log in a file and none
    of it on the terminal (the full-length numbers are in the README)."""
    assert main(["demo", "--duration", "6", "--drain", "3", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "FCFS" in out and "VTC" in out and "light: mean TTFT (s)" in out
    assert "light: offered / received (tokens/s)" in out
    verdicts = ("light received all", "light's", "light lost")  # whichever this run earned
    for name in ("FCFS", "VTC"):
        said = [line for line in out.splitlines() if line.startswith(f"{name}: ")]
        assert len(said) == 1 and said[0].startswith(tuple(f"{name}: {v}" for v in verdicts)), out
    assert f"the server's log: {tmp_path / 'server.log'}" in out
    assert (tmp_path / "server.log").exists()
    assert "Exceeded concurrency limit" not in captured.err + out
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    assert (tmp_path / "demo.md").read_text().strip() in out
    for name in ("requests_fcfs.csv", "requests_vtc.csv"):
        assert len((tmp_path / name).read_text().splitlines()) > 10


def test_serve_rejects_a_bad_client_weights_file(tmp_path):
    (tmp_path / "w.json").write_text('{"alice": -1}')
    command = ["serve", "--client-weights", str(tmp_path / "w.json")]
    result = subprocess.run(
        [sys.executable, "-m", "minivtc.cli.main", *command], capture_output=True, text=True
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "want an object of client -> weight > 0" in result.stderr


@pytest.mark.slow
def test_bench_scheduler_quick(capsys):
    assert bench.main(["scheduler", "--quick"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [r.split()[0] for r in rows] == ["10", "1000"]


@pytest.mark.slow
def test_bench_engine_quick(capsys):
    assert bench.main(["engine", "--quick", "--repeat", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [r.split()[0] for r in lines[3:5]] == ["1", "4"]
    assert "x [" in lines[3]  # the ratio to transformers: median [min, max]
    assert lines[6].startswith("wall s / process CPU s")
    assert [r.split()[0] for r in lines[8:10]] == ["1", "4"]


def test_bench_sim_quick(capsys):
    assert bench.main(["sim", "--quick", "--repeat", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [r.split() for r in lines[1:3]]
    assert [r[:2] for r in rows] == [["overload", "vtc"], ["overload", "fcfs"]]
    assert all(0 < float(r[5]) <= float(r[6]) for r in rows)  # min <= median of 2 runs
    assert all(float(r[7]) > 0 for r in rows)  # CPU s
    assert lines[3].startswith("overload: VTC / FCFS ") and "x [" in lines[3]
    assert "by CPU time, over 2 rounds" in lines[3]


def test_interleaved_rounds_discard_the_warm_up_and_rotate_who_goes_first():
    order: list[str] = []
    runs = {name: functools.partial(order.append, name) for name in ("a", "b", "c")}
    times = bench_timing.interleaved(runs, rounds=3)
    assert order == ["c", "a", "b"] + ["a", "b", "c"] + ["b", "c", "a"] + ["c", "a", "b"]
    assert all(len(t) == 3 and all(w >= 0 and c >= 0 for w, c in t) for t in times.values())
    assert bench_timing.ratios([(2.0, 0.0), (3.0, 0.0)], [(1.0, 0.0), (1.0, 0.0)]) == [2.0, 3.0]
    assert bench_timing.spread([1.0, 1.5, 1.25]) == "1.25x [1.00x, 1.50x]"


@pytest.mark.skipif(bench.gpu_driver_seen(), reason="this machine shows a GPU driver")
def test_bench_gpu_without_a_gpu_says_so_and_fails():
    """Before importing torch (seconds): a machine with no GPU driver is told at once."""
    result = subprocess.run(
        [sys.executable, "-m", "minivtc.bench", "gpu"], capture_output=True, text=True
    )
    assert result.returncode == 1
    assert "no GPU here" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_bench_profile_quick(capsys):
    """Every share of a step is a percentage, and the bandwidth limit is there."""
    assert bench.main(["profile", "--quick", "--threads", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "cProfile" in lines[0] and "GB/s" in lines[0] and "x limit" in lines[1]
    rows = [r.split() for r in lines[2:6]]
    assert [(r[0], r[1]) for r in rows] == [
        ("bundled", "1"),
        ("bundled", "4"),
        ("tiny-2L", "1"),
        ("tiny-2L", "4"),
    ]
    assert all(cell.endswith("%") for r in rows for cell in r[5:13])


def test_bench_scheduler_interleaves_rounds(capsys):
    assert bench.main(["scheduler", "--quick", "--repeat", "2"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert all(r.count("x [") == 2 for r in rows)  # scan / heap, wall and CPU: median [min, max]


def test_gpu_check_code_path_runs_on_cpu(capsys):
    """The GPU script's model building, engine runs and roofline arithmetic, on a tiny shape."""
    assert bench.main(["gpu", "--preset", "tiny", "--device", "cpu", "--quick", "--no-tests"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "roofline" in out and "first round s" in lines[1] and len(lines) == 6
    assert [r.split()[0] for r in lines[2:5]] == ["1", "16", "64"]


@pytest.mark.slow
def test_serve_command_answers_over_http(tmp_path):
    """`minivtc serve` in the foreground, as a user starts it: health, one completion, the
    operator's weights in the fairness view, then a clean shutdown."""
    import json

    import httpx

    weights = tmp_path / "weights.json"
    weights.write_text(json.dumps({"alice": 2.0}))
    server, url = start_serve("--kv-tokens", "512", "--client-weights", str(weights))
    try:
        body = {"prompt": "A tuple is", "max_tokens": 5, "ignore_eos": True}
        reply = httpx.post(url + "/v1/completions", json=body, headers={"X-Client-Id": "alice"})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 5
        alice = httpx.get(url + "/fairness").json()["clients"]["alice"]
        assert alice["weight"] == 2.0 and alice["counter"] == alice["service"] / 2.0
    finally:
        server.terminate()
        server.wait(timeout=30)
    log = server.stderr.read()
    assert "serving minivtc-tiny with vtc" in log
    # the command restarted itself on the fast allocator, where it found one
    preload = os.environ.get("LD_PRELOAD", preload_for("auto"))
    assert f"allocator: {name_of(preload)}" in log


@pytest.mark.slow
def test_serve_refuses_inconsistent_trust_options():
    for options, why in (
        (["--api-keys", "k.json", "--trust-client-header"], '"proxy": true in the --api-keys'),
        (["--api-keys", "k.json", "--client-weights", "w.json"], "not also --client-weights"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "minivtc.cli.main", "serve", *options],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 2 and why in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("options", "why"),
    [
        (["--kv-tokens", "0"], "a KV pool of 0 tokens holds nothing"),
        (["--kv-tokens", "100000000000"], "more than it could allocate"),
        (["--port", "99999"], "a port is a number from 1 to 65535"),
        (["--shutdown-timeout", "nan"], "--shutdown-timeout must be seconds >= 0"),
        (["--victim", "fair"], "victim only means something with reservation 'none'"),
        (
            ["--reservation", "peak", "--preemption", "swap", "--preempt-gap", "9"],
            "preempt_gap, preemption only mean something with reservation 'none'",
        ),
        (
            ["--reservation", "none", "--preempt-gap", "9"],
            "preempt_gap only means something with victim 'fair'",
        ),
        (["--cached-weight", "0"], "only means something with --prefix-caching"),
        (
            ["--reservation", "none", "--victim", "fair", "--preempt-gap", "1"],
            "below one block's decode charge, w_q x block_size = 32",
        ),
    ],
)
def test_serve_refuses_options_it_would_ignore_or_cannot_honour(options, why, capsys):
    """Each a clear error (exit 2), never a traceback, and never silently another setting."""
    from minivtc.cli.main import main

    try:
        code = main(["serve", *options])
    except SystemExit as e:  # argparse's own refusal
        code = e.code
    assert code == 2 and why in capsys.readouterr().err


@pytest.mark.slow
def test_serve_warns_when_open_to_the_network_without_keys():
    """Bound to every interface (reached here only through loopback) and without keys: the
    log says that anyone can claim any client."""
    server, _ = start_serve("--host", "0.0.0.0", "--kv-tokens", "256")
    server.terminate()
    server.wait(timeout=30)
    assert "WARNING: serving 0.0.0.0 without --api-keys" in server.stderr.read()


def test_reproduce_only_takes_commas_and_repeats_alike(tmp_path, monkeypatch):
    import minivtc.experiments.report as report

    chosen = []
    monkeypatch.setattr(report, "reproduce", lambda out, only: chosen.append(only) or out)
    for args in (["--only", "fig3,validate"], ["--only", "fig3", "--only", "validate"]):
        assert main(["reproduce", *args, "--out", str(tmp_path)]) == 0
    assert chosen == [["fig3", "validate"]] * 2


def test_only_the_command_line_restarts(monkeypatch, capsys):
    """`main([...])` called in a process (a test, a notebook) never replaces that process."""
    monkeypatch.delenv("LD_PRELOAD", raising=False)  # (where a restart would be due)
    monkeypatch.setattr(os, "execve", lambda *args: pytest.fail("restarted"))
    refused = ["serve", "--api-keys", "keys.json", "--client-weights", "weights.json"]
    assert main(refused) == 2  # parsed, then refused by run_serve: no restart on the way
    assert "not also --client-weights" in capsys.readouterr().err


def test_serve_binds_its_threads_unless_told_where(monkeypatch):
    from minivtc.cli import serve

    for name in serve.BINDING:
        monkeypatch.delenv(name, raising=False)
    serve.bind_threads()
    assert os.environ["OMP_PROC_BIND"] == "true"
    monkeypatch.delenv("OMP_PROC_BIND")
    monkeypatch.setenv("OMP_PLACES", "{0}")  # the user's placement is kept as it is
    serve.bind_threads()
    assert "OMP_PROC_BIND" not in os.environ
