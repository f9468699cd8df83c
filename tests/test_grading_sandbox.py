"""Grading untrusted submissions: each attack of a dishonest student, as a short payload in the
assignment's file, and what the grader does with it (`course/sandbox.py`, `course/grade.py`).

Each payload once worked against `minivtc course grade` (a4 stubs graded 30/30, the
instructor's files read or written, the grader stalled); each test says what must hold now.
A payload that needs a path outside the sandbox is given it literally, as a student who has
seen the instructor's machine would write it. Skipped where bubblewrap cannot start."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minivtc.course import sandbox
from minivtc.course.assignments import ASSIGNMENTS, Assignment
from minivtc.course.edition import PACKAGE, REPOSITORY, stub
from minivtc.course.grade import CHANNEL, LIVE, grade
from minivtc.course.instructor.hidden import DEFAULT_SEED, SEED_VARIABLE

needs_sandbox = pytest.mark.skipif(sandbox.why_not() is not None, reason=str(sandbox.why_not()))
(A4,) = [a for a in ASSIGNMENTS if a.key == "a4_vtc"]
(A5,) = [a for a in ASSIGNMENTS if a.key == "a5_metric"]


def a4_edition(out: Path, constant: str = "", body: str = "") -> Path:
    return edition(A4, out, constant, body)


def edition(a: Assignment, out: Path, constant: str = "", body: str = "") -> Path:
    """An edition whose files for `a` have every function left a stub (or given `body`: NAME in
    it the function's name, FILE its file, OWNER its class) and `constant` (a statement after
    the imports of its first file, carried as a student's constant)."""
    for file in dict.fromkeys(f for f, _ in a.functions):
        source = (PACKAGE / file).read_text()
        for _, qualname in [(f, q) for f, q in a.functions if f == file]:
            message = f"stub {qualname}"
            source = stub(source, qualname, message)
            if body:
                owner, _, name = qualname.rpartition(".")
                named = body.replace("NAME", repr(name)).replace("OWNER", repr(owner))
                stubbed = f"raise NotImplementedError({message!r})"
                source = source.replace(stubbed, named.replace("FILE", repr(file)))
        if constant and file == a.functions[0][0]:
            imports = [
                n for n in ast.parse(source).body if isinstance(n, (ast.Import, ast.ImportFrom))
            ]
            lines = source.splitlines(keepends=True)
            at = max(n.end_lineno or 0 for n in imports)
            source = "".join(lines[:at] + ["\n", constant + "\n"] + lines[at:])
        path = out / "minivtc" / file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return out


def graded(edition: Path, out: Path, key: str = "a4_vtc") -> dict:
    return grade(edition, out, only=[key])["assignments"][0]


# The atexit hook: every failure removed from the junit XML the grader used to read
REWRITE = (
    "_HOOK = __import__('atexit').register(lambda: exec("
    + repr(
        "import re, sys\n"
        "for a in sys.argv:\n"
        "    if a.startswith('--junitxml='):\n"
        "        p = a.split('=', 1)[1]\n"
        "        t = re.sub(r'<(failure|error|skipped)[^>]*?(/>|>.*?</(failure|error|skipped)>)',"
        " '', open(p).read(), flags=re.S)\n"
        "        t = re.sub(r'(failures|errors|skipped)=\"\\d+\"', r'\\1=\"0\"', t)\n"
        "        open(p, 'w').write(t)\n"
    )
    + "))"
)


@needs_sandbox
def test_an_atexit_hook_that_rewrites_the_report_changes_nothing(tmp_path):
    """a5's tests run outside the sandbox (`grade.CHANNEL`): the hook runs in the sandbox,
    where no report is."""
    g = graded(edition(A5, tmp_path / "ed", REWRITE), tmp_path / "out", A5.key)
    assert A5.key in CHANNEL and g["points"] == 0, g


# A file the student writes whole (the capstone, d1's, d2's) whose policy fails when made, with
# `constant` after its imports
OWN_FILE = (
    '"""A policy."""\n\nfrom minivtc.fairness.scheduler import Scheduler\n\n{constant}\n\n\n'
    "class {name}(Scheduler):\n"
    "    BOUND = 'twice U: a bound argued nowhere, since nothing here is done yet, at all'\n\n"
    "    def __init__(self, *args, **kwargs):\n"
    "        {body}\n"
)
OWN = {
    "a6_fair": ("capstone.py", "FairPolicy"),
    "d1_quota": ("design/quota.py", "QuotaPolicy"),
    "d2_tenants": ("design/tenants.py", "TenantPolicy"),
}


def own_edition(out: Path, key: str, constant: str = "", body: str = "") -> Path:
    """An edition whose file for `key` holds a policy that raises when made (or runs `body`)."""
    file, name = OWN[key]
    path = out / "minivtc" / "course" / file
    path.parent.mkdir(parents=True, exist_ok=True)
    body = body or "raise NotImplementedError('not done')"
    path.write_text(OWN_FILE.format(constant=constant, name=name, body=body))
    return out


@needs_sandbox
@pytest.mark.parametrize("key", ["a4_vtc", "a4b_variants", "a6_fair", "d1_quota", "d2_tenants"])
def test_an_atexit_hook_cannot_rewrite_a_policy_s_report(key, tmp_path):
    """a4's, a4b's, a6's, d1's and d2's tests run outside the sandbox too, the policy they make
    living in it (`grade.LIVE`): the hook runs where no report is (it once kept a4 and a6 at
    30/30)."""
    if key in ("a4_vtc", "a4b_variants"):
        (a,) = [a for a in ASSIGNMENTS if a.key == key]
        ed = edition(a, tmp_path / "ed", REWRITE)
    else:
        hook = "import atexit\n\n" + REWRITE.replace("__import__('atexit')", "atexit")
        ed = own_edition(tmp_path / "ed", key, hook)
    g = graded(ed, tmp_path / "out", key)
    assert key in CHANNEL and key in LIVE and g["points"] == 0, g
    assert g["failures"] and "refused" not in g["note"], g


@needs_sandbox
@pytest.mark.slow
@pytest.mark.parametrize(
    "key", ["a1_llama", "a2_blocks", "a3_batching", "a4_vtc", "a4b_variants", "a5_metric"]
)
def test_each_reference_gets_full_marks_through_the_channel(key, tmp_path):
    """The reference's answers in the edition's files score every point through the sandbox:
    what the tests hand the student's code (a callback, a live VTC, an engine whose scheduler
    lives in the sandbox) must cross the channel. Two did not: a4b's `Engine.step` sent back a
    new block table as nothing (`KeyError` in the tests), and a3's round was handed
    `list.append` as its `dispatched` hook, a builtin the channel will not call back."""
    (a,) = [a for a in ASSIGNMENTS if a.key == key]
    for file in {f for f, _ in a.functions}:
        (tmp_path / "ed" / "minivtc" / file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "ed" / "minivtc" / file).write_text((PACKAGE / file).read_text())
    g = graded(tmp_path / "ed", tmp_path / "out", key)
    assert key in CHANNEL and g["points"] == g["max_points"], g


@needs_sandbox
def test_the_hidden_seed_is_out_of_reach(tmp_path, monkeypatch):
    """d1's workloads are drawn from the instructor's hidden seed; a policy that reads it
    (imported, as a file, or from the grader's environment) and raises it into its feedback
    finds none of them."""
    monkeypatch.setenv(SEED_VARIABLE, "424242")
    body = (
        "import os, pathlib\n"
        "        try:\n"
        "            from minivtc.course.instructor.hidden import seed\n"
        "            SEED = seed()\n"
        "        except ImportError as e:\n"
        "            SEED = f'no seed to import ({type(e).__name__})'\n"
        f"        SEED = str(SEED) + ' ' + str(os.environ.get({SEED_VARIABLE!r}))\n"
        "        here = pathlib.Path(__file__).resolve().parents[1] / 'instructor' / 'hidden.py'\n"
        f"        there = pathlib.Path({str(PACKAGE)!r}) / 'course/instructor/hidden.py'\n"
        "        for path in (here, there):\n"
        "            if path.is_file():\n"
        "                SEED = path.read_text()\n"
        "        raise RuntimeError(f'seed: {SEED}')"
    )
    g = graded(own_edition(tmp_path / "ed", "d1_quota", body=body), tmp_path / "out", "d1_quota")
    assert "424242" not in json.dumps(g) and str(DEFAULT_SEED) not in json.dumps(g), g
    # the seed neither imported nor in the environment: "... no seed to import (...) None"
    said = [f["message"] for f in g["failures"]]
    assert any("no seed to import" in m and m.rstrip().endswith(") None") for m in said), g


@needs_sandbox
def test_the_reference_is_out_of_reach(tmp_path):
    """Each a4 function execs the reference's file (vtc.py, least_counter.py), found through
    the grading copy's `weights` (once a link into the checkout) or at the checkout's own
    path."""
    reference = (
        "def _reference(file, owner):\n"
        "    import pathlib\n"
        "    here = pathlib.Path(__file__).resolve().parents[2] / 'weights'\n"
        f"    for root in (here.resolve().parent, pathlib.Path({str(REPOSITORY)!r})):\n"
        "        path = root / 'minivtc' / file\n"
        "        if path.is_file():\n"
        "            space = {'__name__': 'reference'}\n"
        "            exec(compile(path.read_text(), str(path), 'exec'), space)\n"
        "            return space[owner]\n"
        "    raise FileNotFoundError('no reference')\n"
    )
    body = "return getattr(_reference(FILE, OWNER), NAME)(**locals())"
    edition = a4_edition(tmp_path / "ed", body=body)
    for file in {f for f, _ in A4.functions}:
        path = edition / "minivtc" / file
        path.write_text(path.read_text() + "\n\n" + reference)
    g = graded(edition, tmp_path / "out")
    assert g["points"] == 0, g


@needs_sandbox
@pytest.mark.parametrize("a", [A4, A5], ids=["a4, its policy live", "a5 through the channel"])
def test_a_file_of_the_instructor_never_reaches_the_feedback(a, tmp_path):
    secret = tmp_path / "home" / ".bashrc"
    secret.parent.mkdir()
    secret.write_text("export TOKEN=instructor-secret-4711\n")
    body = f"raise AssertionError(open({str(secret)!r}).read())"
    g = graded(edition(a, tmp_path / "ed", body=body), tmp_path / "out", a.key)
    assert g["points"] == 0
    assert "4711" not in json.dumps(g)
    assert "4711" not in (tmp_path / "out" / "grades.json").read_text()


@needs_sandbox
@pytest.mark.parametrize("a", [A4, A5], ids=["a4, its policy live", "a5 through the channel"])
def test_a_daemon_cannot_rewrite_grades_after_the_grader_exits(a, tmp_path):
    out = tmp_path / "out"
    forged = json.dumps({"assignments": [], "total": 30, "max_total": 30})
    daemon = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        p = {str(out / 'grades.json')!r}\n"
        "        for _ in range(100):\n"
        "            time.sleep(0.05)\n"
        "            if os.path.exists(p):\n"
        "                time.sleep(0.2)\n"
        f"                open(p, 'w').write({forged!r})\n"
        "                break\n"
        "    os._exit(0)\n"
    )
    constant = f"_DAEMON = exec({daemon!r})"
    g = graded(edition(a, tmp_path / "ed", constant), out, a.key)
    time.sleep(1.0)  # the daemon wrote within 0.25 s of grades.json appearing
    assert g["points"] == 0
    assert json.loads((out / "grades.json").read_text())["total"] == 0


@needs_sandbox
@pytest.mark.parametrize("a", [A4, A5], ids=["a4, its policy live", "a5 through the channel"])
def test_nothing_outside_the_sandbox_is_written(a, tmp_path):
    """The checkout stands in: a file outside the sandbox, at a path the student knows."""
    canary = tmp_path / "checkout" / "feedback.py"
    canary.parent.mkdir()
    canary.write_text("untouched\n")
    # the write's error caught, so the module imports and the worker starts once, not per test
    write = f"try:\n    open({str(canary)!r}, 'w').write('rewritten')\nexcept OSError:\n    pass"
    constant = f"_WRITE = exec({write!r})"
    graded(edition(a, tmp_path / "ed", constant), tmp_path / "out", a.key)
    assert canary.read_text() == "untouched\n"


@needs_sandbox
def test_a_named_pipe_for_a_report_cannot_stall_the_grader(tmp_path):
    """The report replaced by a fifo when the tests end: the grader returns within its limit
    and the next submission is graded (a child process, in case it does not)."""
    fifo = (
        "_FIFO = __import__('atexit').register(lambda: exec("
        + repr(
            "import os, sys\n"
            "for a in sys.argv:\n"
            "    if a.startswith('--junitxml='):\n"
            "        p = a.split('=', 1)[1]\n"
            "        os.remove(p)\n"
            "        os.mkfifo(p)\n"
        )
        + "))"
    )
    edition = a4_edition(tmp_path / "ed", fifo)
    script = (
        "from minivtc.course.grade import grade\n"
        f"r = grade({str(edition)!r}, {str(tmp_path / 'out')!r}, time_limit_s=60, "
        "only=['a4_vtc'])\n"
        "print(r['total'])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "0.0"
    assert time.monotonic() - start < 90


@needs_sandbox
@pytest.mark.parametrize("a", [A4, A5], ids=["a4, its policy live", "a5 through the channel"])
def test_no_process_outlives_grading(a, tmp_path):
    marker = f"minivtc-leftover-{os.getpid()}"
    spawn = (
        "import subprocess, sys\n"
        "for _ in range(5):\n"
        "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', "
        f"{marker!r}], start_new_session=True)\n"
    )
    graded(edition(a, tmp_path / "ed", f"_SPAWN = exec({spawn!r})"), tmp_path / "out", a.key)
    time.sleep(0.5)
    assert not [p for p in Path("/proc").glob("[0-9]*") if marker in cmdline(p)]


def cmdline(process: Path) -> str:
    try:
        return (process / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def run_boxed(tmp_path: Path, code: str, limits: sandbox.Limits) -> str:
    root = tmp_path / "root"
    root.mkdir()
    (root / "payload.py").write_text(code)
    box = sandbox.Sandbox(root, limits=limits)
    log = tmp_path / "log"
    assert not box.run([sys.executable, str(sandbox.INSIDE / "payload.py")], log, 60)
    return log.read_text()


@needs_sandbox
def test_memory_processes_and_file_size_are_limited(tmp_path):
    code = (
        "import os, subprocess\n"
        "try:\n"
        "    bytearray(3 << 30)\n"
        "    print('memory: allocated')\n"
        "except MemoryError:\n"
        "    print('memory: refused')\n"
        "started = 0\n"
        "try:\n"
        "    for _ in range(100):\n"
        "        if os.fork() == 0:\n"
        "            __import__('time').sleep(5)\n"
        "            os._exit(0)\n"
        "        started += 1\n"
        "except OSError:\n"
        "    pass\n"
        "print('processes:', started)\n"
        "try:\n"
        "    open('/tmp/big', 'wb').write(bytes(2 << 20))\n"
        "    print('file: written')\n"
        "except OSError:\n"
        "    print('file: refused')\n"
    )
    limits = sandbox.Limits(memory_bytes=2 << 30, processes=20, file_bytes=1 << 20)
    said = run_boxed(tmp_path, code, limits)
    assert "memory: refused" in said, said
    assert int(said.split("processes: ")[1].split()[0]) < 20, said
    assert "file: refused" in said, said


@needs_sandbox
def test_the_sandbox_sees_no_home_no_checkout_and_no_network(tmp_path):
    code = (
        "import os, socket\n"
        f"print('checkout:', os.path.exists({str(REPOSITORY / 'minivtc')!r}))\n"
        "print('home:', os.path.exists(os.path.expanduser('~root/.bashrc')))\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
        "    print('network: yes')\n"
        "except OSError:\n"
        "    print('network: no')\n"
        "print('uid:', os.getuid())\n"
    )
    said = run_boxed(tmp_path, code, sandbox.Limits())
    assert "checkout: False" in said and "home: False" in said, said
    assert "network: no" in said, said
    if os.geteuid() == 0:
        assert f"uid: {sandbox.NOBODY}" in said, said


@needs_sandbox
def test_the_capstone_cannot_reach_the_reference_drr(tmp_path):
    """A capstone that is the reference DRR, exec'd from wherever it can be found (the names
    the capstone's rule refuses appear only in strings): the sandbox holds none."""
    capstone = (
        '"""A capstone."""\n\n'
        "import pathlib\n\n\n"
        "def _reference():\n"
        "    here = pathlib.Path(__file__).resolve().parents[2]\n"
        f"    roots = ((here / 'weights').resolve().parent, pathlib.Path({str(REPOSITORY)!r}))\n"
        "    for root in (*roots, here):\n"
        "        path = root / 'minivtc' / 'fairness' / 'drr.py'\n"
        "        space = {'__name__': 'reference'}\n"
        "        if path.is_file():\n"
        "            exec(compile(path.read_text(), str(path), 'exec'), space)\n"
        "            policy = space['D' + 'RR']\n"
        "            try:\n"
        "                policy()\n"
        "                return policy\n"
        "            except NotImplementedError:\n"
        "                continue\n"
        "    raise FileNotFoundError('no reference')\n\n\n"
        "FairPolicy = _reference()\n"
    )
    path = tmp_path / "ed" / "minivtc" / "course" / "capstone.py"
    path.parent.mkdir(parents=True)
    path.write_text(capstone)
    g = graded(tmp_path / "ed", tmp_path / "out", "a6_fair")
    assert g["points"] == 0, g


def test_without_a_sandbox_an_edition_is_graded_only_when_trusted(tmp_path):
    """bwrap out of reach (an empty PATH): `course grade` refuses and says why;
    `--trust-submissions` grades unsandboxed."""
    ed = edition(A5, tmp_path / "ed")
    env = {**os.environ, "PATH": str(tmp_path), "PYTHONPATH": str(REPOSITORY)}
    command = [sys.executable, "-m", "minivtc", "course", "grade", str(ed), "--only", A5.key]
    refused = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode != 0 and "bubblewrap" in refused.stderr, refused.stderr
    assert "--trust-submissions" in refused.stderr
    assert not (ed / "grades.json").exists()
    trusted = subprocess.run(
        [*command, "--trust-submissions"], capture_output=True, text=True, env=env, timeout=300
    )
    assert trusted.returncode == 0, trusted.stderr[-2000:]
    assert json.loads((ed / "grades.json").read_text())["total"] == 0  # a5 left as stubs


@needs_sandbox
def test_a_capstone_built_on_the_reference_drr_runs_none_of_it(tmp_path):
    """FairPolicy subclasses DRR, reached by a name the capstone's rule does not see: its
    methods, inherited ones included, run in the sandbox, where DRR refuses to be built (never
    the reference DRR the tests' side holds)."""
    capstone = (
        '"""A capstone."""\n\n'
        "import importlib\n\n"
        "load = getattr(importlib, 'import_' + 'module')\n"
        "BASE = getattr(load('minivtc.fairness.' + 'drr'), 'D' + 'RR')\n\n\n"
        "class FairPolicy(BASE):\n"
        "    BOUND = 'twice the quantum plus U, as DRR: each turn ends within a quantum'\n\n"
        "    def gap_bound(self, u):\n"
        "        return 2 * (u + 64)\n"
    )
    path = tmp_path / "ed" / "minivtc" / "course" / "capstone.py"
    path.parent.mkdir(parents=True)
    path.write_text(capstone)
    g = graded(tmp_path / "ed", tmp_path / "out", "a6_fair")
    assert g["points"] == 0, g
