"""Which gateway served what: per gateway, per client, the requests served and their input and
output tokens, for `/fairness`, `/metrics` (a `gateway` label) and the gateway's dashboard.

Owns `Served`, one gateway's own book of it. Each row is written by its gateway only, under its
`gateway_id` (`host:port`, the same after a restart: a restarted gateway goes on adding to its
row, and the label set stays gateways x clients), so the store keeps it by plain overwrite, no
merge: the row's whole value rides on the sync the gateway already makes
(`shared_store.SyncIn.served`), only for the clients whose row changed since, and every row
comes back in its answer (`SyncOut.served`): no round trip of its own.

A gateway that (re)starts reads its row back at its first sync and counts on from it (`base`);
one that finds the store lost its data (a new epoch) writes every row again. Without a store
the book is the gateway's alone, under its own id. Not the counters: what a client was
charged is the policy's (`PolicyBooks`); this is what each gateway passed on. Lesson 14.
"""

from __future__ import annotations

__all__ = ["Row", "Served", "as_json"]

Row = tuple[int, int, int]  # (requests, input tokens, output tokens)


class Served:
    """One gateway's rows: what its store holds for it (`base`) plus what it served since."""

    def __init__(self) -> None:
        self.base: dict[str, Row] = {}  # the store's row at our first sync (a restart's past)
        self.own: dict[str, Row] = {}  # served by this process
        self.sent: dict[str, Row] = {}  # what the store holds for us, as we last wrote it

    def record(self, client: str, prompt_tokens: int, output_tokens: int) -> None:
        """A request ended after a backend took it: served, for what it was charged."""
        r, i, o = self.own.get(client, (0, 0, 0))
        self.own[client] = (r + 1, i + prompt_tokens, o + output_tokens)

    def rows(self) -> dict[str, Row]:
        clients = self.base.keys() | self.own.keys()
        return {c: add(self.base.get(c, (0, 0, 0)), self.own.get(c, (0, 0, 0))) for c in clients}

    def unsent(self) -> dict[str, Row]:
        """The rows the store does not hold as they are now."""
        return {c: row for c, row in self.rows().items() if self.sent.get(c) != row}

    def wrote(self, rows: dict[str, Row]) -> None:
        self.sent |= rows

    def first_seen(self, stored: dict[str, Row]) -> None:
        """Our first sync's answer: the store's row for our id (a restart's past) is the base
        we count on from; our own rows go in at the next sync."""
        self.base, self.sent = dict(stored), dict(stored)

    def store_lost(self) -> None:
        """The store came back empty (a new epoch): every row goes in again."""
        self.sent = {}


def add(a: Row, b: Row) -> Row:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def as_json(rows: dict[str, Row]) -> dict[str, dict[str, int]]:
    """`/fairness`'s form of one gateway's rows."""
    keys = ("requests", "input_tokens", "output_tokens")
    return {c: dict(zip(keys, row, strict=True)) for c, row in sorted(rows.items())}
