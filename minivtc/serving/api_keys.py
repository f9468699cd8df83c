"""Who is calling: API keys, and the client each request is charged to.

Owns: reading the keys file (`minivtc serve --api-keys FILE`) and `Auth`, which turns a request's
`Authorization`, `X-Client-Id` and `user` into a `Caller` (the client its service counts
against, and whether it may see every tenant's usage). Does not own: HTTP routes (`server.py`).

Fair scheduling is only as good as the identities it schedules. Without keys a client is
whatever the caller says (`X-Client-Id`, else the body's `user`, else "default"): fine on a
laptop, but a caller who sends a fresh id per request looks like many light clients and takes
their shares (a Sybil attack), and one who names another tenant spends that tenant's counter.
With keys the client is the key's, and what a request says about itself is ignored — unless
the key is a `proxy`'s: a trusted proxy in front of the server authenticates end users and
names them in `X-Client-Id` (or `user`). Trust is a property of one key, never of the server:
any other key holder who could name a client could spend that client's counter.

The keys file is a JSON object from key to its client:

    {"sk-alice": {"client": "alice", "weight": 2}, "sk-ops": {"client": "ops", "admin": true},
     "sk-gateway": {"client": "gateway", "proxy": true}}

`weight` (default 1) is the client's share under the VTC family; `admin` keys may read
`/metrics` and every client's row of `/fairness` (any other key sees only its own row); a
`proxy` key's requests are charged to the client they name (the key's own when they name none).
"""

from __future__ import annotations

import hashlib
import json
import math
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minivtc.serving.openai_api import MAX_CLIENT_ID_CHARS, APIError

__all__ = ["Auth", "Caller", "Key", "MIN_KEY_CHARS", "read_keys", "weights_of"]

FIELDS = {"client": "str", "weight": "number", "admin": "bool", "proxy": "bool"}  # of an entry


@dataclass(frozen=True)
class Caller:
    client: str
    admin: bool  # may read every client's usage (always so without keys: local use)
    # Requests share cached prompt blocks only within one salt: with keys, each key's own
    # (a tenant could otherwise learn from `cached_tokens` what another one sent); without
    # keys (local use, one trusted party), everyone's (None).
    cache_salt: str | None = None


@dataclass(frozen=True)
class Key:
    client: str
    weight: float = 1.0
    admin: bool = False
    proxy: bool = False  # its requests name their client (a trusted proxy's end users)


MIN_KEY_CHARS = 8  # a shorter key is too easy to guess (the keys file's rule, and --api-key's)


def read_keys(path: str | Path) -> dict[str, Key]:
    """The keys file, checked: a ValueError naming the file and the entry at fault."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read the API keys ({e})") from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path}: want a JSON object of key -> {{'client': ..., ...}}")
    keys = {}
    for key, entry in raw.items():
        where = f"{path}: key {key[:3]!r}..."  # (no more: the message may reach a log)
        if len(key) < MIN_KEY_CHARS:
            raise ValueError(
                f"{where} is shorter than {MIN_KEY_CHARS} characters: too easy to guess"
            )
        if not isinstance(entry, dict) or not set(entry) <= set(FIELDS):
            fields = ", ".join(f"'{name}': {kind}" for name, kind in FIELDS.items())
            raise ValueError(f"{where}: want {{{fields}}}")
        client, weight = entry.get("client"), entry.get("weight", 1.0)
        if not isinstance(client, str) or not 0 < len(client) <= MAX_CLIENT_ID_CHARS:
            raise ValueError(f"{where}: 'client' must be 1 to {MAX_CLIENT_ID_CHARS} characters")
        if (bad := unprintable(client)) is not None:
            raise ValueError(f"{where}: 'client' {client!r} holds {bad!r}: printable text only")
        if (
            isinstance(weight, bool)
            or not isinstance(weight, (int, float))
            or not (
                0 < weight < math.inf  # (json reads Infinity and NaN: neither is a share)
            )
        ):
            raise ValueError(f"{where}: 'weight' must be a number > 0 and finite")
        for flag in ("admin", "proxy"):
            if not isinstance(entry.get(flag, False), bool):
                raise ValueError(f"{where}: '{flag}' must be true or false")
        keys[key] = Key(client, float(weight), entry.get("admin", False), entry.get("proxy", False))
    weights: dict[str, float] = {}
    for k in keys.values():
        if weights.setdefault(k.client, k.weight) != k.weight:
            raise ValueError(f"{path}: client {k.client!r} has keys with different weights")
    return keys


def weights_of(keys: Mapping[Any, Key]) -> dict[str, float]:
    """Each client's weight, for the scheduler."""
    return {k.client: k.weight for k in keys.values()}


class Auth:
    """Names the caller of each request. `keys=None`: no authentication (local use)."""

    def __init__(self, keys: dict[str, Key] | None = None):
        # Keys are looked up by their SHA-256, so a lookup's timing says nothing about the keys.
        self.keys = None if keys is None else {digest(k): v for k, v in keys.items()}

    def caller(
        self, authorization: str | None, client_header: str | None = None, user: str | None = None
    ) -> Caller:
        """Who sent a request; raises APIError 401 for a missing or unknown key (with keys),
        400 for a client id that is too long."""
        if self.keys is None:
            return Caller(named(client_header, user) or "default", admin=True)
        key = self.key(authorization)
        claimed = named(client_header, user) if key.proxy else None
        return Caller(claimed or key.client, key.admin, cache_salt=key.client)

    def key(self, authorization: str | None) -> Key:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise APIError(
                401,
                "You didn't provide an API key: send 'Authorization: Bearer YOUR_KEY'.",
                code="missing_api_key",
            )
        assert self.keys is not None, "only an Auth with keys checks them"
        key = self.keys.get(digest(token.strip()))
        if key is None:
            raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")
        return key


def named(client_header: str | None, user: str | None) -> str | None:
    """The client a request names itself (header first), checked once here for `serve` and
    `route` alike: at most `MAX_CLIENT_ID_CHARS` characters of printable text (any script:
    "Zoë" is a client; "eve\n" and "a\x00b" are not, since no header or log line could carry
    them)."""
    for value, param in ((client_header, "X-Client-Id"), (user, "user")):
        if value:
            if len(value) > MAX_CLIENT_ID_CHARS:
                raise APIError(
                    400,
                    f"a client id is at most {MAX_CLIENT_ID_CHARS} characters; "
                    f"this one has {len(value)}",
                    param,
                )
            if (bad := unprintable(value)) is not None:
                raise APIError(400, f"a client id is printable text; this one holds {bad!r}", param)
            return value
    return None


def unprintable(name: str) -> str | None:
    """The first character of `name` that is not printable text: a control or format
    character, a lone surrogate, a private-use or unassigned code point (Unicode's "C"
    categories). None: every character is printable (spaces included)."""
    return next((ch for ch in name if unicodedata.category(ch).startswith("C")), None)


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
