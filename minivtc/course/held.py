"""What the other side of the channel holds of what this side sent, so that only what changed
travels: owns `Held` (the tests' side: what to send) and `changed` (the sandbox's: its copy
changed as sent).

Live (a4's, a4b's and a6's policies stay in the sandbox between calls), the tests send the same
requests at every call: a6's paper workloads send each running request at each of tens of
thousands of steps. The sandbox keeps its copy of each, so a request sent again travels as the
fields that changed since (`delta` nodes: a step's new token and its `num_computed`), a list
that grew at its end as its new items (`grown`), and one that did not change as its id alone
(`ref`). What is held here is what was sent, never what the sandbox's code made of its copy: a
request comes back as the tests' own (`codec.py`), so nothing the student's code does to its
copy reaches the tests. Does not encode values (`codec.py`) nor frame them (`channel.py`).
"""

from __future__ import annotations

import enum
import functools
import operator
from collections.abc import Callable
from itertools import compress, count
from typing import Any

from minivtc.course.channel import (
    PLAIN,
    SCALARS,
    ChannelError,
    Foreign,
    set_state,
    slots_of,
    state_of,
)

__all__ = ["Held", "changed", "fields_of", "fixed", "unchanged"]
NAMES = frozenset((str,))  # the type of a field's name


class Shot:
    """An object's fields as last sent: its class, their names and values, and which of them
    may change in place (a list, an object: compared by their own changes at each send)."""

    __slots__ = ("kind", "names", "values", "loose")

    def __init__(self, kind: type, names: tuple[str, ...], values: tuple) -> None:
        self.kind, self.names, self.values = kind, names, values
        self.loose = tuple(i for i, x in enumerate(values) if not fixed(x))

    def update(self, values: tuple, changed: list[int]) -> None:
        """Now sent with `values`, its fields `changed` (a new value that is fixed, as the
        old was, leaves which fields are loose as they were: a step's `num_computed`)."""
        self.values = values
        for i in changed:
            if i in self.loose or not fixed(values[i]):
                self.loose = tuple(i for i, x in enumerate(values) if not fixed(x))
                return


class Held:
    """Each tensor's version, each plain container's content and (live) each object's fields
    and each list's items, as the other side holds them."""

    def __init__(self) -> None:
        self.versions: dict[int, int] = {}  # tensor id -> the version the other side holds
        self.synced: dict[int, Any] = {}  # container id -> the plain content the other holds
        self.states: dict[int, Shot] = {}  # live: object id -> its fields as sent
        self.lists: dict[int, list] = {}  # live: list id -> its plain items, as sent

    def clear(self) -> None:  # (a new worker holds nothing)
        for held in (self.versions, self.synced, self.states, self.lists):
            held.clear()

    def changes(self, v: Any, ident: int, seen: set[int], enc: Callable) -> Any:
        """Object `ident` (`v`) as a node: whole where the other side holds no copy with these
        fields (`None`: the caller sends it whole), else the fields that changed since
        (`delta`), or its id alone (`ref`). `enc(x, seen)` encodes a field."""
        names, values = fields_of(v)
        shot = self.states.get(ident)
        if shot is None or shot.kind is not type(v) or shot.names != names:
            self.states[ident] = Shot(type(v), names, values)
            return None
        before, nodes, changed = shot.values, [], []
        for i in compress(count(), map(operator.is_not, values, before)):  # (no Python loop)
            if not same(values[i], before[i]):
                changed.append(i)
                nodes.append([names[i], enc(values[i], seen)])
        for i in shot.loose:  # the same list or object as before: what changed in it
            if values[i] is before[i] and (node := self.inside(values[i], seen, enc)) is not None:
                nodes.append([names[i], node])
        if changed:
            shot.update(values, changed)
        return {"delta": ident, "set": nodes} if nodes else {"ref": ident}

    def inside(self, x: Any, seen: set[int], enc: Callable) -> Any:
        """The node for a field that holds the object it held when sent: None where the other
        side's copy holds all of it (unchanged, or sent elsewhere in this message)."""
        key = id(x)
        if key in seen:
            return None
        if type(x) is list and (tail := self.tail(x, key)) is not None:  # (a request's tokens)
            seen.add(key)
            return {"grown": key, "list": tail} if tail else None
        if key in self.states:  # (an object sent before: a request's parameters)
            seen.add(key)
            if (node := self.changes(x, key, seen, enc)) is not None:
                return None if "ref" in node else node
            del self.states[key]  # (its fields are others: whole)
            seen.discard(key)
        node = enc(x, seen)
        return None if unchanged(node) else node

    def tail(self, v: list, ident: int) -> list | None:
        """The items a list the other side holds grew by at its end (a request's output
        tokens); None: it is not held, or changed otherwise. (Its old items are compared with
        `==`: an int turned into an equal float would go unseen; the tests make neither.)"""
        old = self.lists.get(ident)
        if old is None:
            return None
        held, now = len(old), len(v)
        if now == held:  # (the common case, a prompt: compared without a copy)
            return [] if v == old else None
        if now < held or v[:held] != old:
            return None
        tail = v[held:]
        if not SCALARS.issuperset(map(type, tail)):
            return None
        old.extend(tail)
        return tail


def changed(held: Any, tag: str, n: dict, dec: Callable, memo: dict[int, Any]) -> Any:
    """The sandbox's copy `held` of the tests' object, changed as node `n` says: its fields
    that changed (`delta`), a list's new items (`grown`). `dec(node, memo)` decodes a field."""
    if held is None or (tag == "grown") != (type(held) is list):
        raise ChannelError(f"the changes of an object that was never sent ({tag})")
    if tag == "grown":
        if type(n["list"]) is not list or not SCALARS.issuperset(map(type, n["list"])):
            raise ChannelError("a list grown by what is not plain values")
        held.extend(n["list"])
        return held
    state = {k: x if x is None or type(x) in PLAIN else dec(x, memo) for k, x in n["set"]}
    if isinstance(held, Foreign) or not NAMES.issuperset(map(type, state)):
        raise ChannelError("an object's changes must be its fields, by name")
    set_state(held, state)
    return held


def fields_of(v: Any) -> tuple[tuple[str, ...], tuple]:
    """An object's field names and values (`state_of`): read at once where its class keeps
    them in slots only, all set (a request)."""
    cls: Any = type(v)
    if cls.__dictoffset__ and not slots_of(cls):  # (its dictionary only: sampling parameters)
        state = vars(v)
        return tuple(state), tuple(state.values())
    if not cls.__dictoffset__ and (getter := getter_of(cls)) is not None:
        try:
            return slots_of(cls), getter(v)
        except AttributeError:  # an unset slot
            pass
    state = state_of(v)
    return tuple(state), tuple(state.values())


@functools.cache
def getter_of(cls: Any) -> Callable[[Any], tuple] | None:
    slots = slots_of(cls)
    if len(slots) < 2:  # (attrgetter of one name gives the value, not a tuple)
        return None
    return operator.attrgetter(*slots)


def same(x: Any, old: Any) -> bool:
    """Two values that cannot change in place, of one type, equal (types count: 1 != 1.0)."""
    return type(x) is type(old) and fixed(x) and fixed(old) and x == old


def fixed(x: Any) -> bool:
    """Is `x` a value that cannot change in place (then compared by type and value)?"""
    if x is None or type(x) in PLAIN or isinstance(x, enum.Enum):
        return True
    return type(x) is tuple and all(y is None or type(y) in PLAIN for y in x)


def unchanged(node: Any) -> bool:
    """Is `node` the id alone of what the other side holds as it is?"""
    return type(node) is dict and ("ref" in node or "same" in node) and len(node) == 1
