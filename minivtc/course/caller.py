"""The grader's end of the channel: the graded tests run here, a student's code in a sandbox.

A pytest plugin (`-p minivtc.course.caller`), active when the grader sets `SPEC` in the
environment. It starts the worker (`worker.py`) in a sandbox over the package copy that holds
the student's code (`sandbox.py`), and replaces each function the assignment asks for, in
this process's package, by a proxy: a call ships (arguments, self) to the worker, which runs
the student's function there, and copies back the result and the arguments' new state onto
the originals (`channel.Codec`). A file the student writes whole (the capstone, d1's, d2's) is
met by stand-in classes (a base of the student's own: its stand-in) and functions made from the
worker's description of it, each method a proxy. Live (a4's and a4b's VTC, an own file's
classes: `grade.LIVE`), making one makes the object in the sandbox, where it stays between
calls: the stand-in holds its handle (`channel.Remote`), its attributes read and written there
(`Forwarded`, `Session.get`). So the tests and their report stay out of the student's code's
reach: what it sends is data the tests judge, never a verdict.

A worker that does not answer in time, sends what cannot be taken, or dies fails the test
that called it with a `ChannelError` saying so; it is killed and, for the next test, started
afresh (until the grader's deadline). Does not decide points (`grade.py`).
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import pytest

from minivtc.course import sandbox
from minivtc.course.channel import TIMED_OUT, ChannelError, Remote, rebuilt, receive, resolve, send
from minivtc.course.codec import Codec
from minivtc.course.testrun import SPEC  # {"root", "modules", "functions", "own", "deadline"}
from minivtc.course.worker import describe_class

__all__ = ["Session"]
CALL_LIMIT_S = 60.0  # one call of a student's function (a step, a dispatch) takes far less
START_LIMIT_S = 120.0  # the worker's start: importing torch and the student's modules
KEY = pytest.StashKey["Session"]()
BOUND = object()  # the answer to a read of a method (`Session.get`)
# Live: the policy's methods whose answer (None) the tests never use, sent without waiting, so
# the tests and the sandbox run at once (a6's paper workloads: 70,000 calls each); such a call
# is answered only if it raised, read with the next call's answer, before any read of the
# policy: one that raised fails the test
LATER = frozenset({"dispatch", "on_decode", "on_finish", "requeue", "remove", "check_invariants"})
MAX_UNREAD = 64  # calls left for later at most: their failures fit in what a pipe holds
METHODS = (types.FunctionType, property, staticmethod, classmethod, type)


def pytest_configure(config: pytest.Config) -> None:
    text = os.environ.get(SPEC)
    if text is not None:
        session = Session(json.loads(text))
        config.stash[KEY] = session
        session.install()


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    """No call's answer left for later (`LATER`) ends a test unread, or reaches the next."""
    session, failed = pyfuncitem.config.stash.get(KEY, None), True
    try:
        result = yield
        failed = False
    finally:
        if session is not None:  # (a test that failed already: its own failure stands)
            session.settle(strict=not failed)
    return result


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(KEY, None)
    if session is not None:
        session.close()


class Session:
    """One worker in one sandbox, for one assignment's tests; restarted after a failure."""

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.deadline = float(spec["deadline"])  # time.monotonic(), shared with the grader
        live = spec.get("live")  # the policies stay in the sandbox (`grade.LIVE`)
        self.codec = Codec(trusted=True, live=self.remote if live is not None else None)
        self.process: Any = None
        self.scratch = tempfile.TemporaryDirectory(prefix="minivtc-worker-")
        self.handles: dict[int, Remote] = {}  # handle -> the stand-in of what lives there
        self.unread = 0  # calls sent whose answers are not read yet (`LATER`)
        self.classes: dict[str, type] = {}  # a class in the sandbox -> its stand-in here

    def install(self) -> None:
        """Each asked-for function replaced by its proxy; a whole file by stand-ins."""
        for target in self.spec["functions"]:
            module, _, qualname = target.partition(":")
            *path, name = qualname.split(".")
            holder = resolve(":".join([module, ".".join(path)])) if path else resolve(module + ":")
            original = getattr(holder, name)
            setattr(holder, name, functools.wraps(original)(self.proxy(target)))
        for target in self.spec.get("live", []):  # a4's VTC: the same methods as here
            where, _, name = target.partition(":")
            described = describe_class(resolve(target), Codec(trusted=False))
            setattr(importlib.import_module(where), name, self.stand_in(where, name, described))
        if self.spec.get("own"):
            self.stand_ins(self.spec["own"])

    def stand_ins(self, own: str) -> None:
        described = self.start()
        module = importlib.import_module(own)
        for name, value in described.get("constants", {}).items():
            setattr(module, name, value)
        for name in described.get("functions", []):
            setattr(module, name, self.proxy(f"{own}:{name}"))
        for name, cls in described.get("classes", {}).items():
            setattr(module, name, self.stand_in(own, name, cls))

    def stand_in(self, own: str, name: str, cls: dict) -> type:
        """A class whose methods run the student's, in the sandbox (live: its objects too)."""
        bases = tuple(self.base(b) for b in cls["bases"]) or (object,)
        space: dict[str, Any] = {"__module__": own, "__qualname__": name}
        space |= {k: self.codec.decode(v) for k, v in cls["constants"].items()}
        space |= {m: self.proxy(f"{own}:{name}.{m}") for m in cls["methods"]}
        space |= {p: property(self.proxy(f"{own}:{name}.{p}.fget")) for p in cls["properties"]}
        if self.codec.live is not None:
            made = self.proxy(f"{own}:{name}")
            space |= {n: Forwarded(n, v) for n, v in class_data(bases).items() if n not in space}
            space |= {n: Forwarded(n, space[n]) for n in cls["constants"]}
            space |= {m: self.proxy(f"{own}:{name}.{m}", True) for m in LATER & space.keys()}
            space |= {"__new__": lambda _, *a, **k: made(*a, **k), "session": self}
            space["__init__"] = lambda *_, **__: None  # (made there by `__new__`)
            bases = bases if any(issubclass(b, Remote) for b in bases) else (Remote, *bases)
        found = types.new_class(name, bases, {}, lambda ns: ns.update(space))
        self.classes[f"{own}:{name}"] = found
        return found

    def remote(self, handle: int, name: str) -> Remote:
        """The stand-in for what has `handle` in the sandbox (of a class made for `name`)."""
        if handle in self.handles:
            return self.handles[handle]
        if handle >= 0:
            raise ChannelError(f"a handle the sandbox never gives ({handle})")
        if name not in self.classes:
            module, _, qualname = name.partition(":")
            space = {"__module__": module, "session": self}
            made_class = types.new_class(qualname, (Remote,), {}, lambda ns: ns.update(space))
            self.classes[name] = made_class
        made: Any = object.__new__(self.classes[name])
        object.__setattr__(made, "handle", handle)
        self.handles[handle] = made
        return made

    def get(self, kept: Remote, name: str) -> Any:
        """Attribute `name` there: a copy, a stand-in, or (a method) a function calling it."""
        found = self.ask({"get": name, "self": kept.handle}, (), {})
        if found is not BOUND:
            return found

        def method(*args: Any, **kwargs: Any) -> Any:
            return self.ask({"method": name, "self": kept.handle}, args, kwargs)

        method.__qualname__ = method.__name__ = name
        return method

    def set(self, kept: Remote, name: str, value: Any) -> None:
        self.ask({"set": name, "self": kept.handle}, (value,), {})

    def base(self, name: str) -> type:
        try:  # (a class of the student's own file: its stand-in)
            found = self.classes.get(name) or self.codec.allowed(name)
        except ChannelError:
            return object  # a base of the student's own: its methods come with the class
        return found if isinstance(found, type) else object

    def proxy(self, target: str, later: bool = False):
        def call(*args: Any, **kwargs: Any) -> Any:
            return self.ask({"call": target}, args, kwargs, later)

        call.__qualname__ = call.__name__ = target.rpartition(".")[2].rpartition(":")[2]
        return call

    def ask(self, message: dict, args: tuple, kwargs: dict, later: bool = False) -> Any:
        """Send a call (a read, a write); its result, the arguments' new state copied back.
        `later` (`LATER`): answered only if it raised, unless the sandbox may call back."""
        if self.process is None:
            self.start()
        encoded = self.codec.encode([list(args), kwargs])
        later = later and not self.codec.callable_sent and self.unread + 1 < MAX_UNREAD
        send(self.outbox, message | {"args": encoded} | ({"later": 1} if later else {}))
        self.unread += 1
        if later:
            return None
        try:
            reply = self.answers()
            if "raised" in reply:
                if "state" in reply:
                    self.codec.decode(reply["state"])
                raise rebuilt(reply["raised"])
            if reply.get("bound") is True:
                return BOUND
            result, _, _ = self.codec.decode(reply["ok"])
        except ChannelError as e:
            self.stop()
            raise ChannelError(f"grading stopped your code in the sandbox: {e}") from None
        return result

    def answers(self) -> dict:
        """This call's answer, after those of the calls left for later that raised (no other
        answers): the first of these, or this one's."""
        raised = None
        for _ in range(self.unread):  # (each call sent has at most one answer)
            reply = self.await_reply()
            if not reply.get("later"):
                self.unread = 0
                return raised or reply
            if "raised" not in reply:
                raise ChannelError("an answer to a call that asked for none")
            raised = raised or reply
        raise ChannelError("no answer to the call")

    def settle(self, strict: bool = True) -> None:
        """At a test's end: the answers not read yet (`strict`: one that raised fails it)."""
        try:
            if self.unread and self.process is not None:
                self.ask({"call": "builtins:len"}, ((),), {})  # (nothing: its answer comes last)
        except Exception:
            if strict:
                raise

    def await_reply(self) -> dict:
        """The worker's answer, calling back the test's functions it asks for meanwhile."""
        while True:
            limit = min(self.deadline, time.monotonic() + CALL_LIMIT_S)
            message = receive(self.inbox, limit)
            if type(message) is not dict:
                raise ChannelError("an answer that is not a message")
            if "callback" not in message:
                return message
            send(self.outbox, self.callback(message))

    def callback(self, message: dict) -> dict:
        """Call the test's function (a clock) or helper the worker holds: the package's only."""
        function = self.codec.known(message["callback"], object)
        method = message.get("method")
        if type(method) is str and not method.startswith("_"):
            function = getattr(function, method)  # a method of the tests' own helper
        inner = getattr(function, "__func__", function)
        if not isinstance(inner, types.FunctionType) or not (inner.__module__ or "").startswith(
            "minivtc."
        ):
            raise ChannelError(f"asked to call {type(function).__name__}, not a function")
        args, kwargs = self.codec.decode(message["args"])
        try:
            return {"ok": self.codec.encode(function(*args, **kwargs))}
        except Exception as e:
            return {"raised": f"{type(e).__name__}: {e}"[:500]}

    def start(self) -> dict:
        """The worker, in a fresh sandbox; its description of the student's own file."""
        if time.monotonic() >= self.deadline:
            raise ChannelError(f"{TIMED_OUT}: the time limit for this assignment is spent")
        inbox, theirs_out = os.pipe()
        theirs_in, outbox = os.pipe()
        box = sandbox.Sandbox(Path(self.spec["root"]), weights=self.weights())
        argv = [sys.executable, "-m", "minivtc.course.worker", str(theirs_in), str(theirs_out)]
        log = Path(self.scratch.name) / "worker.txt"
        self.process = box.start(argv, log, pass_fds=(theirs_in, theirs_out))
        os.close(theirs_in)
        os.close(theirs_out)
        self.inbox, self.outbox = inbox, outbox
        self.codec.held.clear()  # a new worker holds no tensor, no container, no object
        for gone in self.handles.values():
            object.__setattr__(gone, "handle", 0)  # (a handle no worker gives)
        self.handles.clear()
        hello = {"hello": self.spec["modules"], "own": self.spec.get("own")}
        send(outbox, hello | {"live": self.spec.get("live"), "staff": self.spec.get("staff")})
        try:
            reply = receive(inbox, min(self.deadline, time.monotonic() + START_LIMIT_S))
        except ChannelError as e:
            self.stop()
            raise ChannelError(f"your code did not start in the sandbox: {e}") from None
        if "raised" in reply:
            self.stop()
            raise rebuilt(reply["raised"])
        return reply.get("ok") or {}

    def weights(self) -> Path | None:
        weights = self.spec.get("weights")
        return Path(weights) if weights else None

    def stop(self) -> None:
        self.unread = 0
        self.codec.callable_sent = False
        if self.process is not None:
            sandbox.stop(self.process)
            os.close(self.inbox)
            os.close(self.outbox)
            self.process = None

    def close(self) -> None:
        self.stop()
        log = Path(self.scratch.name) / "worker.txt"
        if log.is_file() and not log.is_symlink():
            with log.open("rb") as f:
                said = f.read(20000).decode(errors="replace")
            print(f"\n--- the sandboxed code's output ---\n{said}")
        self.scratch.cleanup()


class Forwarded:
    """A class attribute of a live stand-in (`Scheduler.name`, a capstone's `BOUND`): read on
    the class, its value; read or written on an instance, the instance's, in the sandbox (a
    base's class attribute here must not hide what the object there holds)."""

    def __init__(self, name: str, value: Any) -> None:
        self.name, self.value = name, value

    def __get__(self, kept: Any, owner: Any = None) -> Any:
        return self.value if kept is None else type(kept).session.get(kept, self.name)

    def __set__(self, kept: Any, value: Any) -> None:
        type(kept).session.set(kept, self.name, value)


def class_data(bases: tuple[type, ...]) -> dict[str, Any]:
    """The class attributes that are not methods, of `bases` and theirs (not a stand-in's)."""
    found: dict[str, Any] = {}
    for klass in reversed([k for b in bases for k in b.__mro__ if not issubclass(k, Remote)]):
        for name, value in vars(klass).items():
            if not name.startswith("__") and not isinstance(value, METHODS):
                found[name] = value
    return found
