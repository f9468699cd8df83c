"""The sandbox's end of the channel: a student's functions, called by the grader's tests.

Run as `python -m minivtc.course.worker IN OUT` inside the sandbox (`sandbox.py`), in the
package copy that holds the student's code; IN and OUT are the channel's file descriptors
(`channel.py`). It answers `hello` (import the assignment's modules, the student's code with
them, and describe the classes and functions of a file the student writes whole, the
capstone), `call` (run one function on the arguments sent, and send back its result and what
it did to its arguments; a call left for later, `later`, is answered only if it raised) and,
live (a4, a6: the policies stay here between calls, `lives`), `get`, `set` and `method` on an
object kept here, by its handle. While a call runs it may ask the grader to call back one of
the test's own functions or helpers (`Opaque`). Decides nothing: whatever it sends is checked
by the grader's tests (`caller.py`).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any

from minivtc.course import staff
from minivtc.course.channel import items_of, name_of, receive, resolve, send
from minivtc.course.codec import Codec

__all__ = ["answer", "describe_class", "lives"]

MESSAGE_CHARS = 2000  # an exception's message sent back is cut here


def main(argv: list[str]) -> int:
    inbox, outbox = int(argv[0]), int(argv[1])

    def callback(ident: int, args: tuple, kwargs: dict, method: str | None = None) -> Any:
        encoded = codec.encode([list(args), kwargs])
        send(outbox, {"callback": ident, "method": method, "args": encoded})
        answer = receive(inbox, float("inf"))
        if "raised" in answer:
            raise RuntimeError(f"the test's function raised: {answer['raised']}")
        return codec.decode(answer["ok"])

    codec = Codec(trusted=False, callback=callback)
    while True:
        try:
            message = receive(inbox, float("inf"))
        except Exception:  # the grader is gone: so is this
            return 0
        reply = answer(codec, message)
        if reply is not None:  # (a call left for later that did not raise: no answer)
            send(outbox, reply)


def answer(codec: Codec, message: dict) -> dict | None:
    if "hello" in message:
        said = hello(message["hello"], message.get("own"), message.get("staff"))
        live = message.get("live")
        try:
            if "ok" in said and live is not None:  # the policies stay here: handles travel
                codec.live = lives(tuple(resolve(c) for c in live), message.get("own"))
        except (ImportError, AttributeError) as e:  # (the student's file lacks the class)
            return {"raised": {"type": name_of(type(e)), "message": str(e)[:MESSAGE_CHARS]}}
        return said
    args: list = []
    kwargs: dict = {}
    try:
        if "get" in message:
            return got(codec, codec.decode({"handle": message["self"]}), message["get"])
        args, kwargs = codec.decode(message["args"])
        # a function the tests call (a4b's `Engine.step` on their engine), not a live object's
        # method nor a class: what it did to the tests' objects is its result, sent back whole
        live = codec.live is not None and bool(args) and codec.live(args[0])
        called = resolve(message["call"]) if "call" in message else None
        codec.whole = "call" in message and not live and not isinstance(called, type)
        if "set" in message:
            setattr(codec.decode({"handle": message["self"]}), message["set"], args[0])
            return {"ok": codec.encode([None, args, kwargs])}
        if "method" in message:
            function = getattr(codec.decode({"handle": message["self"]}), message["method"])
        else:
            function = called
        result = items_of(function(*args, **kwargs))
        return None if message.get("later") else {"ok": codec.encode([result, args, kwargs])}
    except BaseException as e:  # noqa: BLE001 (the student's code may raise anything)
        raised = {"type": name_of(type(e)), "message": str(e)[:MESSAGE_CHARS]}
        found = {"raised": raised, "later": bool(message.get("later"))}
        try:
            return found | {"state": codec.encode([None, args, kwargs])}
        except Exception:
            return found


def got(codec: Codec, kept: Any, name: str) -> dict:
    """Attribute `name` of an object kept here: its value, or word that it is a method (the
    grader's side then calls it here by name)."""
    value = getattr(kept, name)
    if inspect.ismethod(value) and value.__self__ is kept:
        return {"bound": True}
    return {"ok": codec.encode([value, [], {}])}


def lives(classes: tuple[type, ...], own: str | None) -> Any:
    """Which objects stay here between calls: a policy (`Scheduler`), its books (`Ledger`),
    the classes named, and whatever the student's own module makes."""
    from minivtc.fairness.ledger import Ledger
    from minivtc.fairness.scheduler import Scheduler

    kept = (Scheduler, Ledger, *classes)
    return lambda v: isinstance(v, kept) or (own is not None and type(v).__module__ == own)


def hello(modules: list[str], own: str | None, keep: list[str] | None = None) -> dict:
    """Import the assignment's modules (the student's code runs here first); describe `own`,
    the module the student writes whole: its classes' methods, properties and constants,
    and its functions. `keep` (`course test`'s, `testrun.kept`): first, every other
    assignment function gets the staff's answer (`staff.load`), as the tests' side does."""
    try:
        if keep is not None:
            staff.load(keep)
        for module in modules + ([own] if own else []):
            importlib.import_module(module)
    except BaseException as e:  # noqa: BLE001
        return {"raised": {"type": name_of(type(e)), "message": str(e)[:MESSAGE_CHARS]}}
    return {"ok": describe(importlib.import_module(own)) if own else {}}


def describe(module: Any) -> dict:
    classes, functions, constants = {}, [], {}
    codec = Codec(trusted=False)
    for name, value in vars(module).items():
        if inspect.isclass(value) and not another_modules(value, module.__name__):
            classes[name] = describe_class(value, codec)
        elif inspect.isfunction(value) and value.__module__ == module.__name__:
            functions.append(name)
        elif not name.startswith("__") and isinstance(value, (bool, int, float, str)):
            constants[name] = value
    return {"classes": classes, "functions": functions, "constants": constants}


def another_modules(cls: type, module: str) -> bool:
    """Is `cls` another module of the package's (which the grader's side has too)?"""
    return cls.__module__ != module and cls.__module__.split(".")[0] in ("minivtc", "builtins")


def describe_class(cls: type, codec: Codec) -> dict:
    """Its methods and properties, its bases' included (all run here: a base the grader's
    side also has, a reference policy say, must not run there in its place), and its
    constants."""
    methods, properties, constants = {}, {}, {}
    for klass in reversed(cls.__mro__[:-1]):  # object's own stay the grader's
        for name, value in vars(klass).items():
            if inspect.isfunction(value) and name not in KEPT:
                methods[name] = True
            elif isinstance(value, property) and value.fget is not None:
                properties[name] = True
            elif not name.startswith("__") and isinstance(value, (bool, int, float, str)):
                constants[name] = codec.encode(getattr(cls, name))
    bases = [name_of(b) for b in cls.__bases__]
    return {
        "bases": bases,
        "methods": list(methods),
        "properties": list(properties),
        "constants": constants,
    }


# Methods that make the class itself work on the grader's side, never sent
KEPT = {"__getattribute__", "__getattr__", "__setattr__", "__delattr__", "__new__"}
KEPT |= {"__init_subclass__", "__class_getitem__", "__subclasshook__"}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
