"""`minivtc bench peer`'s parts that decide what it reports: the random checkpoint every engine
loads, the worker's answers (tokens, the plain path's top logits), and the CPU time of a process
tree (vLLM computes in a child process)."""

import hashlib
import json
import subprocess
import sys
import threading

import pytest
import torch

from minivtc.bench.checkpoint import write_checkpoint
from minivtc.bench.peer_worker import ANSWER, tree_cpu_seconds
from minivtc.bench.timing import QUIET_TIMEOUT_S, wait_until_quiet
from minivtc.model.config import preset
from minivtc.model.llama import CausalSequences
from minivtc.model.weights import bundled_weights_dir, load_model


def test_the_bench_1b_preset_has_at_least_a_billion_parameters():
    assert preset("bench-1b").num_params >= 1_000_000_000


def test_a_random_checkpoint_loads_in_minivtc_and_transformers_alike(tmp_path):
    transformers = pytest.importorskip("transformers")
    root = write_checkpoint("tiny", tmp_path / "a")
    assert json.loads((root / "config.json").read_text())["hidden_size"] == preset("tiny").dim
    ours, _ = load_model(root)
    hf = transformers.LlamaForCausalLM.from_pretrained(root, dtype=torch.float32).eval()
    ids = torch.randint(3, 4096, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(ids).logits[0]
        got = ours(ids[0], torch.arange(20), CausalSequences([20]))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    again = write_checkpoint("tiny", tmp_path / "b")  # seeded: the same bytes

    def digest(r):
        return hashlib.sha256((r / "model.safetensors").read_bytes()).hexdigest()

    assert digest(root) == digest(again)


def test_a_checkpoint_refuses_a_vocabulary_other_than_the_bundled_tokenizers(tmp_path):
    with pytest.raises(ValueError, match="vocabulary"):
        write_checkpoint("llama-2-7b", tmp_path)


def ask(process, message):
    process.stdin.write(json.dumps(message) + "\n")
    process.stdin.flush()
    for line in process.stdout:
        if line.startswith(ANSWER):
            return json.loads(line[len(ANSWER) :])
    raise AssertionError("the worker ended without answering")


@pytest.mark.slow
def test_the_minivtc_worker_answers_with_the_engines_tokens_and_the_plain_paths_top_logits():
    command = [sys.executable, "-m", "minivtc.bench.peer_worker", "minivtc"]
    command += [str(bundled_weights_dir()), "--max-batch", "2"]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        for line in process.stdout:  # its "ready"
            if line.startswith(ANSWER):
                break
        prompts = [[1, 450, 12, 77, 9], [1, 300, 301, 302, 303]]
        got = ask(process, {"prompts": prompts, "new_tokens": 6})
        assert got["wall_s"] > 0 and got["cpu_s"] >= 0
        assert 0 < got["decode_s"] < got["wall_s"]  # the steps after the prefill, timed apart
        assert [len(t) for t in got["tokens"]] == [6, 6]
        top = ask(process, {"top_logits": prompts[0]})
        assert top["ids"][0] == got["tokens"][0][0]  # greedy took the plain path's best
        assert top["logits"] == sorted(top["logits"], reverse=True)
    finally:
        process.stdin.close()
        process.wait(timeout=60)
    assert process.returncode == 0


def test_the_cpu_time_of_a_process_tree_counts_a_live_childs_work():
    spin = (
        "import time\n"
        "t = time.process_time()\n"
        "while time.process_time() - t < 0.5: pass\n"
        "print('spun', flush=True)\n"
        "time.sleep(30)\n"
    )
    before = tree_cpu_seconds()
    child = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "spun"  # it has used 0.5 s of CPU, and lives
        assert tree_cpu_seconds() - before >= 0.45  # the child's 0.5 s, in clock ticks
    finally:
        child.kill()
        child.wait()


def test_a_turn_waits_until_the_other_contenders_processes_are_idle():
    """vLLM's engine core keeps a core busy for a second after its run: the next contender's
    turn starts only once every other one's process tree is idle, not while it spins."""
    spin_until_told = (
        "import sys, threading\n"
        "stop = threading.Event()\n"
        "threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()\n"
        "print('spinning', flush=True)\n"
        "while not stop.is_set(): pass\n"
        "print('idle', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", spin_until_told],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "spinning"
        waiting = threading.Thread(target=wait_until_quiet, args=([child.pid],))
        waiting.start()
        waiting.join(1.0)
        assert waiting.is_alive()  # a second later, still waiting: the other still spins
        child.stdin.write("stop\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "idle"
        waiting.join(QUIET_TIMEOUT_S - 1.5)
        assert not waiting.is_alive()  # it went idle, and the turn began before the timeout
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow
def test_bench_peer_names_the_machine_kind_and_the_allocator_above_its_table():
    """The CPU's model and instruction sets and the allocator every engine ran on head each
    run's output (speeds differ by both); minivtc alone, a tiny run."""
    command = [sys.executable, "-m", "minivtc", "bench", "peer", "--batches", "1,2"]
    command += ["--new-tokens", "4", "--repeat", "1", "--vllm-modes", "none"]
    command += ["--no-transformers", "--allocator", "glibc", "--vllm-python", ""]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    machine = next(line for line in lines if line.startswith("machine: "))
    assert machine.endswith("CPUs, glibc malloc") and ("AVX-512" in machine or "no AVX" in machine)
    assert lines.index(machine) < lines.index("batch 1:") < lines.index("batch 2:")


def test_an_unknown_minivtc_mode_is_refused_before_any_engine_starts():
    from minivtc.cli.main import main

    with pytest.raises(SystemExit, match=r"--minivtc-modes: turbo\? \(packed, compiled, plain\)"):
        main(["bench", "peer", "--minivtc-modes", "compiled,turbo", "--no-transformers"])
