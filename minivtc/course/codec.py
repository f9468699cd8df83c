"""Python values to JSON and back, on one side of the channel (`channel.py`).

Owns `Codec`. The grader's side never unpickles what the sandbox sends: it rebuilds containers,
numbers, strings, tensors (raw bytes of an allowed dtype) and the package's objects, whose state
it sets; another class is kept as a `Foreign` record, never imported. Each side names what it
sent by an id, and what comes back under that id updates the original in place; what the other
side holds travels as its id, or as its changes (`held.Held`). What cannot be rebuilt (a lambda)
travels as an opaque id, which the sandbox may call back (`Opaque`: a test's clock). Live: a
policy stays in the sandbox behind a `Remote`; the tests' objects return as ids, or `whole`."""

from __future__ import annotations

import base64
import enum
import importlib
import types
from collections import OrderedDict, defaultdict, deque
from typing import Any

import numpy
import torch

from minivtc.course.channel import (
    DTYPES,
    FUNCTIONS,
    KINDS,
    PLAIN,
    SEQUENCES,
    ChannelError,
    Foreign,
    Opaque,
    Remote,
    function_node,
    importable,
    is_plain,
    name_of,
    refill,
    resolve,
    set_state,
    slots_of,
    snapshot_of,
    state_of,
    tensor_node,
    tensor_of,
)
from minivtc.course.held import Held, changed

__all__ = ["Codec"]
GRADED = "minivtc.course.graded"
CONTAINERS, OBJECT = frozenset(KINDS.values()), object()  # (`value`: none of its kinds)


class Codec:
    """One side's encoder and decoder. `trusted`: the grader's side, which keeps every object
    it sends alive (its id is the object's name) and takes back only what it may rebuild."""

    def __init__(self, trusted: bool, callback: Any = None, live: Any = None) -> None:
        self.trusted = trusted
        self.callback = callback  # the sandbox's: calls an opaque value back
        self.live = live  # the sandbox's: keep `live(obj)`? the grader's: handle -> a Remote
        self.objects: dict[int, Any] = {}  # id -> the object (grader: its own; sandbox: copies)
        self.names: dict[int, int] = {}  # the sandbox's: id(copy) -> the grader's id
        self.callable_sent = False  # what the sandbox may call back was sent
        self.whole = False  # the sandbox's, in a plain call (a4b's step): the tests' objects
        self.held = Held()  # what the other side holds: sent as its id, or its changes
        self.fresh = 0

    def encode(self, value: Any) -> Any:
        return self.enc(value, set())

    def ident(self, value: Any) -> int:
        """The name `value` goes by: the grader's id, or the sandbox's own (negative)."""
        if self.trusted:
            self.objects[id(value)] = value
            return id(value)
        if id(value) in self.names:
            return self.names[id(value)]
        self.fresh -= 1
        self.objects[self.fresh] = value
        self.names[id(value)] = self.fresh
        return self.fresh

    def enc(self, v: Any, seen: set[int]) -> Any:
        if v is None or type(v) in PLAIN:
            return v
        if id(v) in self.held.states and id(v) not in seen:  # live: a request sent before
            seen.add(id(v))
            return self.changes(v, id(v), seen)
        if type(v) not in CONTAINERS and (found := self.value(v, seen)) is not OBJECT:
            return found
        ident = self.ident(v)
        if ident > 0 and self.live is not None and not self.trusted and not self.whole:
            return {"ref": ident}  # the tests' own (a request): theirs to change, not the policy's
        if isinstance(v, FUNCTIONS):
            self.callable_sent = True
            return function_node(v, ident, self.trusted)
        if ident < 0 and self.live is not None and not self.trusted and self.live(v):
            return {"handle": ident, "class": name_of(type(v))}  # (each time it is met)
        if ident in seen:
            return {"ref": ident}
        seen.add(ident)
        return self.mutable(v, ident, seen)

    def value(self, v: Any, seen: set[int]) -> Any:
        """`v` as a value that has no id (a number, a tuple, a class), or `OBJECT`."""
        if isinstance(v, enum.Enum):
            return {"enum": name_of(type(v)), "name": v.name}
        if isinstance(v, (int, float, numpy.generic)) and hasattr(v, "item"):
            return v.item()  # a numpy number: its Python value
        if isinstance(v, torch.Tensor):
            return tensor_node(v, self.ident(v), self.held.versions, self.trusted)
        if isinstance(v, (torch.dtype, torch.device)):
            return {"torch": str(v)}
        if isinstance(v, bytes):
            return {"bytes": base64.b64encode(v).decode()}
        if isinstance(v, tuple) and hasattr(v, "_fields"):
            return {"named": name_of(type(v)), "items": [self.enc(x, seen) for x in v]}
        if type(v) in (tuple, frozenset, range, torch.Size):
            items = list(v) if not isinstance(v, range) else [v.start, v.stop, v.step]
            return {type(v).__name__: [self.enc(x, seen) for x in items]}
        if isinstance(v, type):
            return {"class": name_of(v)}
        if isinstance(v, (Opaque, Remote)):  # (what the other side holds: by its name)
            return {"opaque": v.ident} if isinstance(v, Opaque) else {"handle": v.handle}
        return OBJECT

    def mutable(self, v: Any, ident: int, seen: set[int]) -> Any:
        if self.live is not None and self.trusted and type(v).__module__.startswith(GRADED):
            self.callable_sent = True
            return {"opaque": ident}  # the tests' own helper (a predictor): theirs, called back
        if type(v) is list and (tail := self.held.tail(v, ident)) is not None:
            return {"grown": ident, "list": tail} if tail else {"ref": ident}
        kind = type(v).__name__
        if type(v) in (list, set, deque, dict) and is_plain(v):
            return self.plain(v, ident)
        self.held.synced.pop(ident, None)  # (what the other side holds is sent whole)
        if type(v) in (list, set, deque):
            found = {kind: [self.enc(x, seen) for x in v], "id": ident}
            return found | ({"maxlen": v.maxlen} if isinstance(v, deque) else {})
        if type(v) in (dict, OrderedDict, defaultdict):
            pairs = [[self.enc(k, seen), self.enc(x, seen)] for k, x in v.items()]
            factory = self.enc(v.default_factory, seen) if isinstance(v, defaultdict) else None
            return {"dict": pairs, "kind": kind, "id": ident, "factory": factory}
        if isinstance(v, Foreign):
            return {"obj": v.name, "id": ident, "state": self.enc(v.state, seen)}
        if isinstance(v, types.ModuleType):
            return {"module": v.__name__, "id": ident}
        if (hasattr(v, "__dict__") or slots_of(v.__class__)) and "<locals>" not in name_of(type(v)):
            if self.live is not None and self.trusted:
                return self.changes(v, ident, seen)
            return {"obj": name_of(type(v)), "id": ident, "state": self.enc(state_of(v), seen)}
        if self.trusted:
            return {"opaque": ident}
        raise ChannelError(f"cannot send back {type(v).__qualname__} (not a value)")

    def changes(self, v: Any, ident: int, seen: set[int]) -> dict:
        """An object the sandbox holds (live: a request) as what changed since (`Held`)."""
        node = self.held.changes(v, ident, seen, self.enc)
        if node is None:  # (not held, or its fields are others: whole)
            return {"obj": name_of(type(v)), "id": ident, "state": self.enc(state_of(v), seen)}
        return node

    def plain(self, v: Any, ident: int) -> dict:
        """A container of plain values as it is, or its id alone where the other holds it."""
        snapshot = snapshot_of(v)
        if self.held.synced.get(ident) == snapshot and ident > 0:
            return {"same": ident}
        if self.live is not None and self.trusted and type(v) is list:
            self.held.lists[ident] = list(v)
        if ident > 0:
            self.held.synced[ident] = snapshot
        kind = type(v).__name__
        tag = "dict" if isinstance(v, dict) else kind
        items = [list(pair) for pair in v.items()] if isinstance(v, dict) else list(v)
        found = {tag: items, "kind": kind, "id": ident, "plain": True, "factory": None}
        return found | ({"maxlen": v.maxlen} if isinstance(v, deque) else {})

    def decode(self, node: Any) -> Any:
        try:  # (anything malformed raises one of these, which the tests see as a ChannelError)
            return self.dec(node, {})
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as e:
            raise ChannelError(f"a malformed answer ({type(e).__name__}: {e})") from None

    def dec(self, n: Any, memo: dict[int, Any]) -> Any:
        if n is None or type(n) in PLAIN:
            return n
        if type(n) is list:
            raise ChannelError("a bare list where a value was expected")
        (tag, *_) = n
        if tag in ("tuple", "frozenset", "Size", "range"):
            return SEQUENCES[tag]([self.dec(x, memo) for x in n[tag]])
        if tag == "same":
            found = self.objects.get(n["same"])
            if n["same"] <= 0 or found is None or n["same"] not in self.held.synced:
                raise ChannelError("an unchanged value that was never sent")
            return found
        if tag == "ref":
            return memo[n["ref"]] if n["ref"] in memo else self.known(n["ref"], object)
        if tag in ("delta", "grown"):  # (never on the tests' side: it holds no copy)
            held = None if self.trusted or n[tag] <= 0 else self.objects.get(n[tag])
            memo[n[tag]] = held
            return changed(held, tag, n, self.dec, memo)
        if tag in ("list", "set", "deque", "dict"):
            return self.container(tag, n, memo)
        if tag == "obj":
            return self.instance(n, memo)
        return self.leaf(tag, n)

    def leaf(self, tag: str, n: dict) -> Any:
        if tag == "tensor":
            return self.tensor_back(n)
        if tag == "bytes":
            return base64.b64decode(n["bytes"])
        if tag == "torch":
            text = n["torch"]
            return DTYPES[text.removeprefix("torch.")] if "torch." in text else torch.device(text)
        if tag == "enum":
            cls = self.allowed(n["enum"])
            if not issubclass(cls, enum.Enum):
                raise ChannelError(f"{n['enum']} is not an enum")
            return cls[n["name"]]
        if tag == "named":
            return self.allowed(n["named"])(*[self.dec(x, {}) for x in n["items"]])
        if tag == "class":
            return self.allowed(n["class"])
        if tag == "function":
            return self.function_back(n)
        if tag == "module":
            if self.trusted:
                return self.known(n["id"], types.ModuleType)
            return self.keep(n["id"], importlib.import_module(n["module"]))
        if tag == "handle" and self.trusted:
            return self.live(int(n["handle"]), str(n["class"]))
        if tag == "handle":  # (a policy kept here: never the tests' object, never another)
            if n["handle"] >= 0 or not self.live(found := self.objects.get(n["handle"])):
                raise ChannelError(f"no object in the sandbox has handle {n['handle']}")
            return found
        if tag == "opaque":
            if self.trusted:
                return self.known(n["opaque"], object)
            return Opaque(n["opaque"], self.callback)
        raise ChannelError(f"an unknown kind of value: {tag!r}")

    def container(self, tag: str, n: dict, memo: dict[int, Any]) -> Any:
        kind = KINDS[n.get("kind", tag)]
        original: Any = self.objects.get(n["id"]) if n["id"] > 0 else None
        if self.trusted and n["id"] > 0 and type(original) is not kind:
            raise ChannelError(f"a {tag} sent back under the id of a {type(original).__name__}")
        if original is None:
            original = kind(maxlen=n.get("maxlen")) if kind is deque else kind()
            if not self.trusted and n["id"] > 0:
                self.keep(n["id"], original)
        memo[n["id"]] = original
        self.held.lists.pop(n["id"], None)  # (changed there, a4b's step: it holds this now)
        if n.get("plain"):
            return self.plain_back(original, tag, n)
        self.held.synced.pop(n["id"], None)
        if tag == "dict":
            pairs = [(self.dec(k, memo), self.dec(x, memo)) for k, x in n["dict"]]
            original.clear()
            original.update(pairs)
            if kind is defaultdict:
                original.default_factory = self.dec(n["factory"], memo)
        else:
            items = [self.dec(x, memo) for x in n[tag]]
            original.clear()
            (original.update if kind is set else original.extend)(items)
        return original

    def plain_back(self, original: Any, tag: str, n: dict) -> Any:
        refill(original, tag, n[tag], False)
        if n["id"] > 0:
            self.held.synced[n["id"]] = snapshot_of(original)
        return original

    def instance(self, n: dict, memo: dict[int, Any]) -> Any:
        ident = n["id"]
        original = self.objects.get(ident) if ident > 0 else None
        if self.trusted and ident > 0 and original is None:
            raise ChannelError(f"a reference to nothing that was sent ({ident})")
        if original is not None and not isinstance(original, Foreign):
            if name_of(type(original)) != n["obj"]:
                raise ChannelError(f"an object's class changed to {n['obj']}")
        elif self.trusted and not importable(n["obj"]):
            original = Foreign(n["obj"], {})
        else:
            cls = self.allowed(n["obj"])
            original = object.__new__(cls) if self.trusted else cls.__new__(cls)
            if not self.trusted and ident > 0:
                self.keep(ident, original)
        memo[ident] = original
        self.held.states.pop(ident, None)  # (as the list's above: the grader's side keeps them)
        state = self.dec(n["state"], memo)
        if type(state) is not dict or not all(type(k) is str for k in state):
            raise ChannelError("an object's state must be a dict of names")
        if isinstance(original, Foreign):
            original.state = state
            return original
        if hasattr(original, "__dict__"):
            vars(original).clear()
        set_state(original, state)
        return original

    def tensor_back(self, n: dict) -> torch.Tensor:
        ident = n["tensor"]
        if "data" not in n:
            return self.known(ident, torch.Tensor)
        t = tensor_of(n)
        original = self.objects.get(ident) if ident > 0 else None
        if self.trusted and original is not None:
            if not isinstance(original, torch.Tensor) or original.shape != t.shape:
                raise ChannelError("a tensor came back with another shape")
            with torch.no_grad():
                original.copy_(t)
            self.held.versions.pop(ident, None)
            return original
        made = torch.nn.Parameter(t, n["grad"]) if n.get("param") else t.requires_grad_(n["grad"])
        if not self.trusted and ident > 0:
            self.keep(ident, made)
            self.held.versions[ident] = made._version  # (made here: never an inference tensor)
        return made

    def function_back(self, n: dict) -> Any:
        if self.trusted:
            return self.allowed(n["function"])  # the sandbox's own: only the package's
        try:
            found = resolve(n["function"]) if n["function"] else None
        except (ImportError, AttributeError):
            found = None
        return self.keep(n["id"], found) if found is not None else Opaque(n["id"], self.callback)

    def keep(self, ident: int, copy: Any) -> Any:  # the sandbox's copy of the grader's `ident`
        self.objects[ident] = copy
        self.names[id(copy)] = ident
        return copy

    def known(self, ident: int, kind: type) -> Any:
        if not isinstance(found := self.objects.get(ident), kind) or found is None:
            raise ChannelError(f"a reference to nothing that was sent ({ident})")
        return found

    def allowed(self, name: str) -> Any:
        """A class or function by name: on the grader's side only the package's (never the
        grading machinery's, never the standard library's: no `os.system` by name)."""
        if self.trusted and not importable(name):
            raise ChannelError(f"{name} is not the package's")
        try:
            return resolve(name)
        except (ImportError, AttributeError) as e:
            raise ChannelError(f"cannot find {name}: {e}") from None
