"""The channel between the grader's tests and a student's code in the sandbox: calls in,
results out, as JSON on a pair of pipes.

Owns the framing (`send`, `receive`: a length, then the JSON; every read has a deadline and a
size cap, so that nothing the sandbox does can stall the grader), `ChannelError` (what the
sandbox sent cannot be taken: the test that called fails with it), and the values that stand
for what cannot travel (`Foreign`, `Opaque`), and the exception the sandbox's code raised as
the grader may make it (`rebuilt`). Turning values into JSON and back is
`codec.py`'s; running calls is `caller.py`'s (the grader's side) and `worker.py`'s (the
sandbox's).
"""

from __future__ import annotations

import base64
import builtins
import functools
import importlib
import json
import os
import select
import struct
import time
import types
from collections import OrderedDict, defaultdict, deque
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["ChannelError", "DTYPES", "FUNCTIONS", "Foreign", "KINDS", "Opaque", "PLAIN"]
__all__ += ["Remote", "SEQUENCES", "TIMED_OUT", "function_node", "importable", "is_plain"]
__all__ += ["items_of", "name_of", "rebuilt", "receive", "refill", "resolve", "send", "set_state"]
__all__ += ["SCALARS", "slots_of", "snapshot_of", "state_of", "tensor_node", "tensor_of"]

TIMED_OUT = "no answer within the time limit"  # a failure's note that `grade.py` looks for
MAX_MESSAGE = 256 << 20  # bytes: a1's and a3's tensors fit many times over
HEADER = struct.Struct(">Q")
DTYPES = {
    str(t).removeprefix("torch."): t
    for t in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64)
    + (torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
}


class ChannelError(RuntimeError):
    """What the sandbox sent cannot be taken: malformed, too large, too late, or the
    sandbox is gone. The test that saw it fails with this message."""


class Foreign:
    """An object of a class the grader's side does not load (a student's own class): its
    class's name and state, sent back as they came."""

    def __init__(self, name: str, state: dict) -> None:
        self.name, self.state = name, state

    def __repr__(self) -> str:
        return f"<{self.name} (the student's class)>"


class Opaque:
    """The sandbox's stand-in for a value the grader could not send, or keeps (a test's own
    predictor): calling it, or one of its methods, asks the grader's side to call the
    original (`callback`)."""

    def __init__(self, ident: int, callback: Any) -> None:
        self.ident, self.callback = ident, callback

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.callback(self.ident, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self.callback(self.ident, args, kwargs, name)


class Remote:
    """The tests' side's stand-in for an object that lives in the sandbox between calls (a
    policy, its ledger): only its handle is here. Its attributes are read and written there,
    and each of its methods runs there (`caller.Session`, the class's `session`)."""

    handle: int
    session: Any

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "handle":
            raise AttributeError(name)
        return type(self).session.get(self, name)

    def __setattr__(self, name: str, value: Any) -> None:
        type(self).session.set(self, name, value)

    def __repr__(self) -> str:
        return f"<{type(self).__qualname__} in the sandbox>"


def name_of(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def resolve(name: str) -> Any:
    module, _, qualname = name.partition(":")
    found: Any = importlib.import_module(module)
    for part in [p for p in qualname.split(".") if p]:
        found = getattr(found, part)
    return found


PLAIN = (bool, int, float, str)
SCALARS = frozenset((*PLAIN, type(None)))  # (checked over a container at once: `is_plain`)
KEYS = frozenset(PLAIN)  # a plain dict's keys: no None
MISSING = object()  # an unset slot
KINDS: dict[str, Any] = {"list": list, "set": set, "deque": deque, "dict": dict}
KINDS |= {"OrderedDict": OrderedDict, "defaultdict": defaultdict}
SEQUENCES: dict[str, Any] = {"tuple": tuple, "frozenset": frozenset, "Size": torch.Size}
SEQUENCES["range"] = lambda items: range(*items)
FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, functools.partial)


def importable(name: str) -> bool:
    """May the grader's side rebuild `name`? The package's classes, not the grading code's."""
    module = name.partition(":")[0]
    return module.startswith("minivtc.") and not (
        module.startswith("minivtc.course.") and not module.startswith("minivtc.course.graded")
    )


def function_node(f: Any, ident: int, trusted: bool) -> dict:
    """A function by its name where it has one (the grader's side: and its id, to be called
    back or sent back as itself)."""
    name = f"{getattr(f, '__module__', None)}:{getattr(f, '__qualname__', '')}"
    named = (types.FunctionType, types.BuiltinFunctionType)  # (a builtin: time's clocks)
    plain = isinstance(f, named) and "<locals>" not in name and not name.startswith("None:")
    if trusted:
        return {"function": name if plain else None, "id": ident}
    if ident > 0:
        return {"opaque": ident}  # the grader's own, back as itself
    if plain:
        return {"function": name, "id": ident}
    raise ChannelError(f"cannot send back {name} (a function of no module)")


def refill(original: Any, tag: str, items: list, grown: bool) -> None:
    """`original` (a list, set, deque or dict) made to hold `items`, which must be plain
    (`grown`: `items` added at a list's end)."""
    if tag == "dict":
        if not all(type(p) is list and len(p) == 2 for p in items):
            raise ChannelError("a malformed dict")
        items = [tuple(p) for p in items]
    flat = [x for p in items for x in p] if tag == "dict" else items
    if not SCALARS.issuperset(map(type, flat)):
        raise ChannelError("a container said plain holds something else")
    if not grown:
        original.clear()
    if tag == "dict":
        original.update(items)
    else:
        (original.update if tag == "set" else original.extend)(items)


def state_of(v: Any) -> dict:
    """An object's fields: its dictionary and its slots (a Request keeps its fields there)."""
    state = dict(vars(v)) if hasattr(v, "__dict__") else {}
    slots = ((s, getattr(v, s, MISSING)) for s in slots_of(v.__class__))
    return state | {s: x for s, x in slots if x is not MISSING}


def set_state(v: Any, state: dict) -> None:
    """`v`'s fields (`state_of`) set to `state`."""
    slots = slots_of(v.__class__)
    for name, value in state.items():
        if name in slots:
            object.__setattr__(v, name, value)
        else:
            vars(v)[name] = value


def tensor_node(t: torch.Tensor, ident: int, versions: dict[int, int], trusted: bool) -> dict:
    """A tensor as its id alone where the other side holds it as it is (`versions`), else
    with its contents."""
    version = version_of(t)
    if version is not None and versions.get(ident) == version:
        return {"tensor": ident}
    if trusted and version is not None:
        versions[ident] = version
    return {"tensor": ident} | tensor_fields(t)


def tensor_fields(t: torch.Tensor) -> dict:
    """A tensor's dtype, shape and raw bytes (base64), and whether it is a parameter."""
    data = t.detach().contiguous().cpu()
    raw = data.reshape(-1).view(torch.uint8).numpy().tobytes()
    return {
        "dtype": str(data.dtype).removeprefix("torch."),
        "shape": list(data.shape),
        "data": base64.b64encode(raw).decode(),
        "param": isinstance(t, torch.nn.Parameter),
        "grad": t.requires_grad,
    }


def tensor_of(n: dict) -> torch.Tensor:
    """The tensor `tensor_fields` described, its bytes checked against its shape and dtype."""
    dtype = DTYPES[n["dtype"]]
    shape = [int(s) for s in n["shape"]]
    raw = bytearray(base64.b64decode(n["data"]))
    if len(raw) != torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size():
        raise ChannelError("a tensor's bytes do not match its shape")
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape)


def version_of(t: torch.Tensor) -> int | None:
    """How many times `t` was changed in place (None: an inference tensor keeps no count)."""
    try:
        return t._version
    except RuntimeError:
        return None


def is_plain(v: Any) -> bool:
    """Holds `v` plain values only (None, bool, int, float, str; a dict's keys too)?"""
    if isinstance(v, dict):
        return SCALARS.issuperset(map(type, v.values())) and KEYS.issuperset(map(type, v))
    return SCALARS.issuperset(map(type, v))


def snapshot_of(v: Any) -> Any:
    """What a plain container holds, to compare with what was sent (types count: 1 != 1.0)."""
    items = tuple(v.items()) if isinstance(v, dict) else tuple(v)
    return type(v), items, tuple(map(type, items)) if len(items) < 64 else None


@functools.cache
def slots_of(cls: Any) -> tuple[str, ...]:
    """The slots of a class and its bases (a Request keeps its fields there)."""
    return tuple(s for c in cls.__mro__ for s in getattr(c, "__slots__", ()) if s != "__dict__")


def items_of(result: Any) -> Any:
    """A generator's items, which can travel (a list); anything else as it is."""
    return (
        list(result) if isinstance(result, Iterator) and not isinstance(result, deque) else result
    )


def rebuilt(raised: Any) -> BaseException:
    """The exception the student's code raised, as the grader may make it: a built-in or the
    package's exception class with its message, else a RuntimeError naming it."""
    if type(raised) is not dict:
        return ChannelError("a malformed exception")
    name, message = str(raised.get("type")), str(raised.get("message"))[:2000]
    module, _, qualname = name.partition(":")
    cls: Any = None
    if module == "builtins":
        cls = getattr(builtins, qualname, None)
    elif module.startswith("minivtc.") and not module.startswith("minivtc.course"):
        try:
            cls = resolve(name)
        except (ImportError, AttributeError):
            cls = None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except Exception:
            pass
    return RuntimeError(f"{qualname}: {message}")


# -- framing ---------------------------------------------------------------------------------


def send(fd: int, message: Any) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def receive(fd: int, deadline: float) -> Any:
    """One message from `fd` by `deadline` (time.monotonic()); ChannelError otherwise."""
    (size,) = HEADER.unpack(read_exactly(fd, HEADER.size, deadline))
    if size > MAX_MESSAGE:
        raise ChannelError(f"an answer of {size} bytes (at most {MAX_MESSAGE})")
    try:
        return json.loads(read_exactly(fd, size, deadline))
    except (ValueError, RecursionError) as e:
        raise ChannelError(f"an answer that is not JSON ({e})") from None


def read_exactly(fd: int, size: int, deadline: float) -> bytes:
    chunks, left = [], size
    while left:
        wait = None if deadline == float("inf") else deadline - time.monotonic()
        if wait is not None and (wait <= 0 or not select.select([fd], [], [], wait)[0]):
            raise ChannelError(TIMED_OUT)
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise ChannelError("the sandbox is gone (it crashed or exited)")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
