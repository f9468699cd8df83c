"""The sandbox a student's code runs in while it is graded or tested.

Owns `Sandbox` (a command run under bubblewrap, with limits, and what it may see) and
`why_not` (why this machine cannot sandbox, or None). One sandbox per submission and
assignment. What it sees, read-only: the interpreter and its libraries (`/usr`, the Python
installation, the virtual environment), and one folder, `/grading`, holding the package copy
the student's code runs in; it writes only a tmpfs scratch (`/tmp`, gone with it) and, where
the caller gives one, an exchange folder (`/exchange`). No home directory, no checkout, no
other submission, no network (every namespace unshared but the user's, see below), and its
own pid namespace: when its first process ends, or the grader kills it, the kernel kills
everything it started, a double-forked daemon in a session of its own included.

Limits (`Limits`, set with setrlimit before bubblewrap starts, so that every process inside
inherits them): CPU seconds, address space, processes and file size. The kernel never counts
processes against root's limit, so when the grader runs as root the student's code runs as
`nobody` (setpriv, every capability dropped); that needs the sandbox to stay in the machine's
user namespace (a new one would map `nobody` back to root). As another user the sandbox
unshares the user namespace too and keeps that user, whose other processes count against the
process limit (it is set above the count found at the start).

Does not decide grades (`grade.py`, `channel.py`) and does not copy the package (`grade.py`).
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EXCHANGE", "INSIDE", "Limits", "NOBODY", "Sandbox", "stop", "why_not"]

NOBODY = 65534  # the uid and gid root's sandboxes run as
INSIDE = Path("/grading")  # where the package copy is seen from inside
EXCHANGE = Path("/exchange")  # the one folder the sandbox may write that outlives it


@dataclass(frozen=True)
class Limits:
    """What one sandbox may use (each a kernel limit: a process over it is stopped)."""

    cpu_s: int = 600  # CPU seconds of each process; the wall-clock limit is the grader's
    memory_bytes: int = 8 << 30  # address space of each process (torch maps ~2 GiB at import)
    processes: int = 512  # threads count: torch starts one per core
    file_bytes: int = 64 << 20  # the largest file it may write
    scratch_bytes: int = 256 << 20  # its /tmp


@dataclass(frozen=True)
class Sandbox:
    """A sandbox over the package copy at `root` (its `minivtc/`), writing only `exchange`
    besides its scratch."""

    root: Path
    exchange: Path | None = None
    weights: Path | None = None  # bound read-only at /grading/weights (the bundled model)
    limits: Limits = Limits()

    def command(self, argv: list[str]) -> list[str]:
        """bwrap's command line around `argv` (paths in `argv` as seen inside)."""
        root = os.geteuid() == 0
        line = ["bwrap", "--die-with-parent", "--new-session", "--clearenv"]
        line += unshared(keep_user=root)
        paths = system_paths()
        for folder in sorted({str(a) for p in paths for a in p.parents if a != Path("/")}):
            line += ["--perms", "0755", "--dir", folder]  # (bwrap would make them 0700)
        for path in paths:
            line += ["--ro-bind", str(path), str(path)]
        line += ["--dev", "/dev", "--proc", "/proc"]
        line += ["--perms", "1777", "--size", str(self.limits.scratch_bytes), "--tmpfs", "/tmp"]
        line += ["--ro-bind", str(self.root), str(INSIDE)]
        if self.weights is not None:
            line += ["--ro-bind", str(self.weights), str(INSIDE / "weights")]
        if self.exchange is not None:
            line += ["--bind", str(self.exchange), str(EXCHANGE)]
        line += ["--chdir", "/tmp"]
        for name, value in environment().items():
            line += ["--setenv", name, value]
        if root:  # drop to nobody, every capability gone (the process limit then holds)
            line += ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
            line += ["--inh-caps=-all", "--bounding-set=-all", "--"]
        return line + argv

    def prepare(self) -> None:
        """Make the package copy readable and the exchange writable by the sandbox's user
        (root's sandboxes run as nobody; a temporary folder is its owner's alone)."""
        if os.geteuid() != 0:
            return
        for folder in [self.root, *self.root.rglob("*")]:
            folder.chmod(0o755 if folder.is_dir() else 0o644)
        if self.exchange is not None:
            os.chown(self.exchange, NOBODY, NOBODY)
        if self.weights is not None:
            (self.root / "weights").mkdir(exist_ok=True)  # the mount point

    def start(self, argv: list[str], log: Path, **popen) -> subprocess.Popen:
        """Start `argv` in the sandbox, its output to `log` (a regular file, limited in size
        by the file-size limit). The caller must `stop` it."""
        self.prepare()
        with log.open("wb") as sink:
            return subprocess.Popen(
                self.command(argv),
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # one group: bwrap and its reaper, killed together
                preexec_fn=functools.partial(apply, self.limits),
                **popen,
            )

    def run(self, argv: list[str], log: Path, time_limit_s: float) -> bool:
        """Run `argv` in the sandbox to its end or the limit; True: it was killed at the
        limit. Returns only once everything it started is gone."""
        process = self.start(argv, log)
        try:
            process.wait(timeout=time_limit_s)
            return False
        except subprocess.TimeoutExpired:
            return True
        finally:
            stop(process)


def stop(process: subprocess.Popen) -> None:
    """Kill the sandbox: bwrap's group, then its pid namespace goes with its first process
    (`--die-with-parent`); waits for bwrap."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def apply(limits: Limits) -> None:
    """The limits, set in the child before it runs bwrap (every process inside inherits
    them)."""
    cpu = (limits.cpu_s, limits.cpu_s)
    resource.setrlimit(resource.RLIMIT_CPU, cpu)
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
    # As another user than root, that user's processes outside count too
    already = 0 if os.geteuid() == 0 else processes_of(os.getuid())
    nproc = already + limits.processes
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def processes_of(uid: int) -> int:
    """The processes and threads `uid` runs now (what the kernel counts against RLIMIT_NPROC)."""
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(list((entry / "task").iterdir()))
            except OSError:
                continue
    return count


def unshared(keep_user: bool) -> list[str]:
    if not keep_user:
        return ["--unshare-all"]
    return [
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
    ]


def system_paths() -> list[Path]:
    """What the interpreter needs, read-only: the system's libraries and tools, the Python
    installation and the virtual environment (nothing under a home folder but these)."""
    found = [Path(p) for p in ("/usr", "/bin", "/lib", "/lib64", "/etc/ld.so.cache")]
    found += [Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()]
    executable = Path(sys.executable).resolve()
    found += [executable.parent] if not any(p in executable.parents for p in found) else []
    return [p for p in dict.fromkeys(found) if p.exists()]


def environment() -> dict[str, str]:
    """The sandbox's whole environment: nothing of the grader's (it may hold secrets)."""
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(INSIDE),
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(min(4, os.cpu_count() or 1))),
    }


@functools.cache
def why_not() -> str | None:
    """None if a sandbox starts here; else why not, in words (once per process)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "setpriv (util-linux) is missing: root's sandboxes run as nobody through it"
    with tempfile.TemporaryDirectory(prefix="minivtc-sandbox-probe-") as scratch:
        log = Path(scratch) / "log"
        root = Path(scratch) / "root"
        root.mkdir()
        try:
            process = Sandbox(root).start([sys.executable, "-c", "pass"], log)
            timed_out = False
            try:
                code = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                timed_out, code = True, -1
            finally:
                stop(process)
        except OSError as e:
            return f"bubblewrap could not start: {e}"
        if timed_out or code != 0:
            said = log.read_text(errors="replace").strip()[-300:]
            return f"bubblewrap could not start: {said or f'exit status {code}'}"
    return None
