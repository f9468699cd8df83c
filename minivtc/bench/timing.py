"""How the benchmarks measure (`minivtc bench`): contenders take turns, round by round, and
each ratio is taken within a round; reported as its median with its range.

Owns `interleaved` (the rounds), `ratios` (by wall or by process CPU time), `spread` ('median
[min, max]'), `load_line` (the machine's load, printed beside a run) and `wait_until_quiet` (a
turn starts on idle cores). This VM's speed drifts by tens of percent from minute to minute: one
run of each contender, one after the other, compares two different machines. Used by `suite.py`,
`policy.py` and `peer.py`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from minivtc.bench.peer_worker import tree_cpu_seconds
from minivtc.serving.allocator import name_of

__all__ = ["QUIET_TIMEOUT_S", "counts", "interleaved", "load_line", "machine_line", "ratios"]
__all__ += ["spread", "wait_until_quiet"]

# Before each turn, every other contender's processes are idle: an engine keeps a core busy for
# a while after its run, on the cores the next contender is about to use (OpenMP threads spin
# after their last parallel region; vLLM's engine core polls its shared-memory queue for a while
# after its last read, `shm_broadcast.SpinCondition`'s busy_loop_s). Idle: under QUIET_CPU_S of
# CPU over a window (`wait_until_quiet`).
QUIET_WINDOW_S = 0.1
QUIET_CPU_S = 0.01  # CPU seconds in one window
QUIET_TIMEOUT_S = 5.0


def counts(text: str) -> list[int]:
    """An argparse type: whole numbers of at least 1 joined by commas ("1,16,64")."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"whole numbers >= 1 joined by commas, not {text!r}")
    return values


def interleaved(
    runs: dict[str, Callable[[], object]], rounds: int, warmup: bool = True
) -> dict[str, list[tuple[float, float]]]:
    """(wall s, process CPU s) of each run, `rounds` times, the runs taking turns.

    This VM's speed drifts by tens of percent from minute to minute, so contenders timed one
    after another see different machines. Taking turns round by round (and rotating who goes
    first) gives each the same spells; a ratio is then taken within a round, and its median
    over rounds is the number to believe. The first round warms allocators and thread pools and
    is discarded. CPU time counts every thread: CPU s / wall s below the thread count means the
    process waited (for another process on a shared machine, or in Python between kernels).
    """
    names = list(runs)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for k in range(-1 if warmup else 0, rounds):
        shift = k % len(names)
        for name in names[shift:] + names[:shift]:
            wall, cpu = time.perf_counter(), time.process_time()
            runs[name]()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if k >= 0:
                times[name].append((wall, cpu))
    return times


def ratios(
    slow: list[tuple[float, float]], fast: list[tuple[float, float]], clock: int = 0
) -> list[float]:
    """Round by round, how many times faster `fast` ran than `slow`: by wall time (clock 0),
    or by process CPU time (clock 1: the work done, blind to the spells a shared machine's
    other processes held the cores, so steadier there; with one thread, the idle wall time)."""
    return [s[clock] / f[clock] for s, f in zip(slow, fast, strict=True)]


def spread(values: list[float], fmt: str = "{:.2f}x") -> str:
    """'median [min, max]', e.g. '1.23x [1.18x, 1.30x]'."""
    lo, mid, hi = (fmt.format(v) for v in (min(values), statistics.median(values), max(values)))
    return f"{mid} [{lo}, {hi}]"


def load_line() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min) {five:.1f} (5 min) on {os.cpu_count()} CPUs"


def machine_line(env: dict[str, str] | None = None) -> str:
    """The CPU (its model, whether it has AVX-512 and AMX), the cores and the allocator the
    measured processes get, for the line above every table: speeds differ by machine kind."""
    env = dict(os.environ) if env is None else env
    model, flags = "an unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    kinds = [
        name for name, flag in (("AVX-512", "avx512f"), ("AMX-BF16", "amx_bf16")) if flag in flags
    ]
    cpus, allocator = os.cpu_count(), name_of(env.get("LD_PRELOAD"))
    return f"machine: {model} ({', '.join(kinds) or 'no AVX-512'}), {cpus} CPUs, {allocator}"


def wait_until_quiet(pids: list[int]) -> None:
    """Return once the process trees of `pids` used under QUIET_CPU_S of CPU in one window of
    QUIET_WINDOW_S (or after QUIET_TIMEOUT_S: a contender that never idles is timed as it is)."""
    deadline = time.monotonic() + QUIET_TIMEOUT_S
    while pids and time.monotonic() < deadline:  # (no others: nothing to wait for)
        before = tree_cpu_seconds(*pids)
        time.sleep(QUIET_WINDOW_S)
        if tree_cpu_seconds(*pids) - before < QUIET_CPU_S:
            return
