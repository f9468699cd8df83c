"""Python values to JSON and back, on one side of the channel (`channel.py`).

Owns `Codec`. The grader's side never unpickles what the sandbox sends: it rebuilds
containers, numbers, strings, tensors (raw bytes of an allowed dtype) and objects of the
package's own classes, whose state it sets; another class is kept as a `Foreign` record, never
imported. Each side names what it sent by an id, and what comes back under that id updates the
original in place (a Request the test holds sees what the student's `dispatch` did to it); a
tensor or a container of plain values the other side holds unchanged travels as its id alone.
What cannot be rebuilt (a lambda) travels as an opaque id, which the sandbox may call back
(`Opaque`; `caller.py` allows it for a function of the package only: a test's clock).
"""

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
    PLAIN,
    ChannelError,
    Foreign,
    Opaque,
    Remote,
    importable,
    is_plain,
    name_of,
    resolve,
    slots_of,
    snapshot_of,
    tensor_fields,
    tensor_of,
    version_of,
)

KINDS: dict[str, Any] = {"list": list, "set": set, "deque": deque, "dict": dict}
KINDS |= {"OrderedDict": OrderedDict, "defaultdict": defaultdict}
GRADED = "minivtc.course.graded"
VALUES = {type(None), bool, int, float, str}


class Codec:
    """One side's encoder and decoder. `trusted`: the grader's side, which keeps every object
    it sends alive (its id is the object's name) and takes back only what it may rebuild."""

    def __init__(self, trusted: bool, callback: Any = None, live: Any = None) -> None:
        self.trusted = trusted
        self.callback = callback  # the sandbox's: calls an opaque value back
        # Objects that live in the sandbox between calls (a4's and a6's policies): the
        # sandbox's `live(obj)` says which it keeps; the grader's `live(handle, class)` gives
        # the stand-in (`Remote`) for one. None: every object travels as its state.
        self.live = live
        self.objects: dict[int, Any] = {}  # id -> the object (grader: its own; sandbox: copies)
        self.names: dict[int, int] = {}  # the sandbox's: id(copy) -> the grader's id
        self.versions: dict[int, int] = {}  # tensor id -> the version the other side holds
        self.synced: dict[int, Any] = {}  # container id -> the plain content the other holds
        self.states: dict[int, dict] = {}  # live: object id -> its plain fields, as sent
        self.lists: dict[int, list] = {}  # live: list id -> its plain items, as sent
        self.fresh = 0

    def encode(self, value: Any) -> Any:
        return self.enc(value, set())

    def ident(self, value: Any) -> int:
        """The name `value` goes by: the grader's id, or (the sandbox's new objects) a
        negative one."""
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
        if isinstance(v, enum.Enum):
            return {"enum": name_of(type(v)), "name": v.name}
        if isinstance(v, (int, float, numpy.generic)) and hasattr(v, "item"):
            return v.item()  # a numpy number: its Python value
        if isinstance(v, torch.Tensor):
            return self.tensor(v)
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
        if isinstance(v, Opaque):
            return {"opaque": v.ident}
        if isinstance(v, Remote):
            return {"handle": v.handle}
        ident = self.ident(v)
        if ident > 0 and self.live is not None and not self.trusted:
            return {"ref": ident}  # the tests' own (a request): theirs to change, not the policy's
        if isinstance(v, FUNCTIONS):
            return self.function(v, ident)
        if ident in seen:
            return {"ref": ident}
        seen.add(ident)
        return self.mutable(v, ident, seen)

    def mutable(self, v: Any, ident: int, seen: set[int]) -> Any:
        if self.live is not None and self.trusted and type(v).__module__.startswith(GRADED):
            return {"opaque": ident}  # the tests' own helper (a predictor): theirs, called back
        if type(v) is list and ident in self.lists:
            grown = self.grown(v, ident)
            if grown is not None:
                return grown
        if self.live is not None and not self.trusted and self.live(v):
            return {"handle": ident, "class": name_of(type(v))}
        kind = type(v).__name__
        if type(v) in (list, set, deque, dict) and is_plain(v):
            return self.plain(v, ident)
        self.synced.pop(ident, None)  # (what the other side holds is sent whole)
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
            state = dict(vars(v)) if hasattr(v, "__dict__") else {}
            for slot in slots_of(v.__class__):
                if hasattr(v, slot):
                    state[slot] = getattr(v, slot)
            if self.live is not None and self.trusted:
                return self.changes(v, ident, state, seen)
            return {"obj": name_of(type(v)), "id": ident, "state": self.enc(state, seen)}
        if self.trusted:
            return {"opaque": ident}
        raise ChannelError(f"cannot send back {type(v).__qualname__} (not a value)")

    def changes(self, v: Any, ident: int, state: dict, seen: set[int]) -> dict:
        """An object the sandbox holds (live: a request sent before) as the fields that changed
        since: a value compared by type and value, a list or an object by its own changes."""
        before = self.states.get(ident)
        marks = {k: (type(x), x) if type(x) in VALUES else mark(x) for k, x in state.items()}
        self.states[ident] = marks
        if before is None or before.keys() != marks.keys():
            return {"obj": name_of(type(v)), "id": ident, "state": self.enc(state, seen)}
        pairs: list = []
        if marks == before and None not in marks.values():  # (its parameters, say)
            return {"obj": name_of(type(v)), "id": ident, "state": {"dict": pairs}, "delta": 1}
        for k, x in state.items():
            if marks[k] is None or marks[k] != before[k]:
                node = self.enc(x, seen)
                if type(node) is not dict or not unchanged(node):
                    pairs.append([k, node])
        changed = {"dict": pairs, "kind": "dict", "id": 0, "factory": None}
        return {"obj": name_of(type(v)), "id": ident, "state": changed, "delta": 1}

    def grown(self, v: list, ident: int) -> dict | None:
        """A list of plain values the sandbox holds (live), grown at its end since it was sent
        (a request's output tokens): the new items only. (Its old items are compared with
        `==`: an int turned into an equal float would go unseen; the tests make neither.)"""
        old = self.lists[ident]
        tail = v[len(old) :]
        if v[: len(old)] != old or not all(x is None or type(x) in PLAIN for x in tail):
            return None
        old.extend(tail)
        return {"list": tail, "id": ident, "grown": 1}

    def plain(self, v: Any, ident: int) -> dict:
        """A container of plain values (a prompt's token ids, the counters) as it is, or as
        its id alone where the other side holds it unchanged."""
        snapshot = snapshot_of(v)
        if self.synced.get(ident) == snapshot and ident > 0:
            return {"same": ident}
        if self.live is not None and self.trusted and type(v) is list:
            self.lists[ident] = list(v)
        if ident > 0:
            self.synced[ident] = snapshot
        kind = type(v).__name__
        tag = "dict" if isinstance(v, dict) else kind
        items = [list(pair) for pair in v.items()] if isinstance(v, dict) else list(v)
        found = {tag: items, "kind": kind, "id": ident, "plain": True, "factory": None}
        return found | ({"maxlen": v.maxlen} if isinstance(v, deque) else {})

    def function(self, f: Any, ident: int) -> dict:
        """A function by its name where it has one (the grader's side: and its id, to be
        called back or sent back as itself)."""
        name = f"{getattr(f, '__module__', None)}:{getattr(f, '__qualname__', '')}"
        named = (types.FunctionType, types.BuiltinFunctionType)  # (a builtin: time's clocks)
        plain = isinstance(f, named) and "<locals>" not in name and not name.startswith("None:")
        if self.trusted:
            return {"function": name if plain else None, "id": ident}
        if ident > 0:
            return {"opaque": ident}  # the grader's own, back as itself
        if plain:
            return {"function": name, "id": ident}
        raise ChannelError(f"cannot send back {name} (a function of no module)")

    def tensor(self, t: torch.Tensor) -> dict:
        ident = self.ident(t)
        found: dict[str, Any] = {"tensor": ident}
        version = version_of(t)
        if version is not None and self.versions.get(ident) == version:
            return found  # the other side holds it as it is
        found |= tensor_fields(t)
        if self.trusted and version is not None:
            self.versions[ident] = version
        return found

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
            items = [self.dec(x, memo) for x in n[tag]]
            return {"tuple": tuple, "frozenset": frozenset, "Size": torch.Size}.get(
                tag, lambda xs: range(*xs)
            )(items)
        if tag == "same":
            found = self.objects.get(n["same"])
            if n["same"] <= 0 or found is None or n["same"] not in self.synced:
                raise ChannelError("an unchanged value that was never sent")
            return found
        if tag == "ref":
            return memo[n["ref"]] if n["ref"] in memo else self.known(n["ref"], object)
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
        if tag == "handle":
            if self.trusted:
                return self.live(int(n["handle"]), str(n["class"]))
            found = self.objects.get(n["handle"])
            if n["handle"] >= 0 or found is None or not self.live(found):
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
        if n.get("grown") and (self.trusted or type(original) is not list):
            raise ChannelError("a list grown that was never sent")
        if self.trusted and n["id"] > 0 and type(original) is not kind:
            raise ChannelError(f"a {tag} sent back under the id of a {type(original).__name__}")
        if original is None:
            original = kind(maxlen=n.get("maxlen")) if kind is deque else kind()
            if not self.trusted and n["id"] > 0:
                self.keep(n["id"], original)
        memo[n["id"]] = original
        if n.get("grown"):
            return self.plain_back(original, tag, n, grown=True)
        if n.get("plain"):
            return self.plain_back(original, tag, n)
        self.synced.pop(n["id"], None)
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

    def plain_back(self, original: Any, tag: str, n: dict, grown: bool = False) -> Any:
        items = n[tag]
        if tag == "dict":
            if not all(type(p) is list and len(p) == 2 for p in items):
                raise ChannelError("a malformed dict")
            items = [tuple(p) for p in items]
        flat = [x for p in items for x in p] if tag == "dict" else items
        if not all(x is None or type(x) in PLAIN for x in flat):
            raise ChannelError("a container said plain holds something else")
        if grown:
            original.extend(items)
            return original
        original.clear()
        if tag == "dict":
            original.update(items)
        else:
            (original.update if tag == "set" else original.extend)(items)
        if n["id"] > 0:
            self.synced[n["id"]] = snapshot_of(original)
        return original

    def instance(self, n: dict, memo: dict[int, Any]) -> Any:
        ident = n["id"]
        original = self.objects.get(ident) if ident > 0 else None
        if n.get("delta") and (self.trusted or original is None):
            raise ChannelError("the changes of an object that was never sent")
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
        state = self.dec(n["state"], memo)
        if type(state) is not dict or not all(type(k) is str for k in state):
            raise ChannelError("an object's state must be a dict of names")
        if isinstance(original, Foreign):
            original.state = state
            return original
        if hasattr(original, "__dict__") and not n.get("delta"):  # (delta: changes only)
            vars(original).clear()
        for name, value in state.items():
            if name in slots_of(original.__class__):
                object.__setattr__(original, name, value)
            else:
                vars(original)[name] = value
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
            self.versions.pop(ident, None)
            return original
        made = torch.nn.Parameter(t, n["grad"]) if n.get("param") else t.requires_grad_(n["grad"])
        if not self.trusted and ident > 0:
            self.keep(ident, made)
            self.versions[ident] = made._version  # (made here: never an inference tensor)
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


def mark(x: Any) -> Any:
    """A field's value to compare with the one sent (None: compared by its own changes)."""
    if x is None or type(x) in PLAIN or isinstance(x, enum.Enum):
        return type(x), x
    if type(x) is tuple and all(y is None or type(y) in PLAIN for y in x):
        return tuple, x, tuple(map(type, x))
    return None


def unchanged(node: dict) -> bool:
    """Is `node` (a list grown, an object's changes) no change at all?"""
    if node.get("grown"):
        return not node["list"]
    return bool(node.get("delta")) and not node["state"]["dict"]
