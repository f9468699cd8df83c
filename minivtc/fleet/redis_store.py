"""The shared store in Redis (or Valkey): `minivtc route --store redis://[:password@]host:port/db`.

Owns `RedisStore`, `shared_store.py`'s three operations (sync, book, release; and
`booked_now`) each one round trip: a Lua script, which Redis runs atomically, or a
transaction. Time is the server's, so the gateways' clocks need not agree; every call has a
timeout (`STORE_TIMEOUT_S`) and is never retried (a failure is `StoreDown`: the gateway falls
back, `fleet_member.py`). Also `parse_store_url`. The client library is redis-py (PyPI).
minivtc/fleet/README.md.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from minivtc.fleet.shared_store import STORE_TIMEOUT_S, Row, StoreDown, SyncIn, SyncOut

__all__ = ["RedisStore", "parse_store_url"]


@dataclass(frozen=True)
class StoreAddress:
    host: str
    port: int
    db: int
    password: str | None
    username: str | None

    def __str__(self) -> str:  # (never the password: /fairness and logs show it)
        return f"redis://{self.host}:{self.port}/{self.db}"


def parse_store_url(url: str) -> StoreAddress:
    """`redis://[[user]:password@]host[:port][/db]`; ValueError saying what is wrong."""
    parts = urlsplit(url)
    if parts.scheme != "redis":
        raise ValueError(f"--store {url!r}: expected redis://[:password@]host:port/db")
    try:
        port = parts.port or 6379
    except ValueError:
        raise ValueError(f"--store: the port is not a number 1-65535 in {url!r}") from None
    path = parts.path.strip("/") or "0"
    if not parts.hostname or not path.isdigit():
        raise ValueError(f"--store {url!r}: expected redis://[:password@]host:port/db")
    password = unquote(parts.password) if parts.password is not None else None
    return StoreAddress(parts.hostname, port, int(path), password, parts.username or None)


# Keys: P:epoch, P:counters (hash), P:gateways
# (sorted by lease expiry), per gateway G P:waiting:G (a set: its latest snapshot, expiring with
# its lease), per backend B P:room:B (booking -> tokens) and P:lease:B (booking by expiry);
# P:served-by (the gateway ids that served) and per id I P:served:I (client -> "requests,input,
# output", `Served`; never expiring: it is history, gateways x clients of it).
LUA_NOW_AND_PURGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function booked(p, b)
  local room, lease = p .. ':room:' .. b, p .. ':lease:' .. b
  local gone = redis.call('ZRANGEBYSCORE', lease, '-inf', now)
  for _, id in ipairs(gone) do redis.call('HDEL', room, id) end
  redis.call('ZREMRANGEBYSCORE', lease, '-inf', now)
  local total = 0
  for _, v in ipairs(redis.call('HVALS', room)) do total = total + tonumber(v) end
  return total
end
"""
LUA_SYNC = (
    LUA_NOW_AND_PURGE
    + """
local p, a = ARGV[1], cjson.decode(ARGV[2])
local lease = tonumber(ARGV[3])
redis.call('SET', p .. ':epoch', ARGV[4], 'NX')
local epoch = redis.call('GET', p .. ':epoch')
if a.epoch == epoch then
  for c, v in pairs(a.lifts) do
    local old = redis.call('HGET', p .. ':counters', c)
    if not old or tonumber(old) < v then redis.call('HSET', p .. ':counters', c, v) end
  end
  for c, d in pairs(a.charges) do redis.call('HINCRBYFLOAT', p .. ':counters', c, d) end
else
  for c, v in pairs(a.counters) do
    local old = redis.call('HGET', p .. ':counters', c)
    if not old or tonumber(old) < v then redis.call('HSET', p .. ':counters', c, v) end
  end
end
local mine = p .. ':waiting:' .. a.gateway
redis.call('DEL', mine)
for _, c in ipairs(a.waiting) do redis.call('SADD', mine, c) end
redis.call('PEXPIRE', mine, lease)
redis.call('ZADD', p .. ':gateways', now + lease, a.gateway)
for b, ids in pairs(a.bookings) do
  for id, tokens in pairs(ids) do
    redis.call('HSET', p .. ':room:' .. b, id, tokens)
    redis.call('ZADD', p .. ':lease:' .. b, now + lease, id)
  end
end
redis.call('ZREMRANGEBYSCORE', p .. ':gateways', '-inf', now)
local waiting = {}
for _, g in ipairs(redis.call('ZRANGE', p .. ':gateways', 0, -1)) do
  waiting[g] = redis.call('SMEMBERS', p .. ':waiting:' .. g)
end
local totals = {}
for _, b in ipairs(a.backends) do totals[b] = booked(p, b) end
if a.served_as ~= '' then
  redis.call('SADD', p .. ':served-by', a.served_as)
  for c, row in pairs(a.served) do redis.call('HSET', p .. ':served:' .. a.served_as, c, row) end
end
local served = {}
for _, g in ipairs(redis.call('SMEMBERS', p .. ':served-by')) do
  served[g] = redis.call('HGETALL', p .. ':served:' .. g)
end
return cjson.encode({epoch = epoch, counters = redis.call('HGETALL', p .. ':counters'),
  waiting = waiting, booked = totals, served = served,
  gateways = redis.call('ZCARD', p .. ':gateways')})
"""
)
LUA_BOOK = (
    LUA_NOW_AND_PURGE
    + """
local p, b, id = ARGV[1], ARGV[2], ARGV[3]
local tokens, budget, lease = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local total = booked(p, b)
if total + tokens > budget then return {0, total} end
redis.call('HSET', p .. ':room:' .. b, id, tokens)
redis.call('ZADD', p .. ':lease:' .. b, now + lease, id)
return {1, total + tokens}
"""
)

LUA_BOOKED = (
    LUA_NOW_AND_PURGE
    + """
local totals = {}
for i = 2, #ARGV do totals[i - 1] = booked(ARGV[1], ARGV[i]) end
return totals
"""
)


class RedisStore:
    """The store in Redis (or Valkey): `address` (`parse_store_url`), keys under `prefix`."""

    def __init__(
        self,
        address: StoreAddress,
        prefix: str = "minivtc",
        lease_s: float = 10.0,
        timeout_s: float = STORE_TIMEOUT_S,
    ) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.address, self.prefix = address, prefix
        self.lease_ms = int(lease_s * 1000)
        self.redis = redis.Redis(
            host=address.host,
            port=address.port,
            db=address.db,
            username=address.username,
            password=address.password,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),  # a failed call is reported, not retried: `StoreDown`
            decode_responses=True,
        )
        self.errors = (redis.RedisError, OSError)
        self.sync_script = self.redis.register_script(LUA_SYNC)
        self.book_script = self.redis.register_script(LUA_BOOK)
        self.booked_script = self.redis.register_script(LUA_BOOKED)
        self.operations = 0  # round trips made (/metrics: operations per request)

    def check(self) -> None:
        """At start: the store answers, and takes our password. ValueError saying why not."""
        import redis

        try:
            self.redis.ping()
        except redis.AuthenticationError as e:
            if self.address.password is None:
                raise ValueError(
                    f"--store {self.address}: the store needs a password "
                    "(redis://:PASSWORD@host:port/db)"
                ) from None
            raise ValueError(
                f"--store {self.address}: the store refused the password ({e})"
            ) from None
        except redis.ResponseError as e:  # (NOAUTH: a password is needed)
            raise ValueError(f"--store {self.address}: {e}") from None
        except self.errors as e:
            raise ValueError(f"--store {self.address}: cannot reach the store ({e})") from None

    def sync(self, it: SyncIn) -> SyncOut:
        payload = {k: v for k, v in vars(it).items()}
        payload["served"] = {c: ",".join(map(str, row)) for c, row in it.served.items()}
        args = [self.prefix, json.dumps(payload), self.lease_ms, uuid.uuid4().hex]
        out = json.loads(self.call(self.sync_script, args))
        flat = out["counters"]  # (HGETALL's flat list; an empty one encodes as {})
        waiting = out["waiting"] if isinstance(out["waiting"], dict) else {}
        booked = out["booked"] if isinstance(out["booked"], dict) else {}  # ({} encodes as [])
        return SyncOut(
            out["epoch"],
            {flat[i]: float(flat[i + 1]) for i in range(0, len(flat), 2)},
            {g: set(c) if isinstance(c, list) else set() for g, c in waiting.items()},
            {b: int(booked.get(b, 0)) for b in it.backends},
            int(out["gateways"]),
            served_rows(out["served"]),
        )

    def book(self, backend: str, booking: str, tokens: int, budget: int) -> tuple[bool, int]:
        args = [self.prefix, backend, booking, tokens, budget, self.lease_ms]
        ok, total = self.call(self.book_script, args)
        return bool(ok), int(total)

    def booked_now(self, backends: list[str]) -> dict[str, int]:
        totals = self.call(self.booked_script, [self.prefix, *backends])
        return {b: int(n) for b, n in zip(backends, totals, strict=True)}

    def release(self, backend: str, booking: str) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.hdel(f"{self.prefix}:room:{backend}", booking)
        pipe.zrem(f"{self.prefix}:lease:{backend}", booking)
        try:
            pipe.execute()
        except self.errors as e:
            raise StoreDown(f"{self.address}: {e}") from None
        self.operations += 1

    def answers(self) -> bool:
        """Whether the store answers now (a gateway serving alone asks, off its event loop)."""
        try:
            return bool(self.redis.ping())
        except self.errors:
            return False

    def call(self, script, args: list):
        try:
            answer = script(args=args)
        except self.errors as e:
            raise StoreDown(f"{self.address}: {e}") from None
        self.operations += 1
        return answer


def served_rows(got) -> dict[str, dict[str, Row]]:
    """The sync's answer's `served`: gateway id -> HGETALL's flat [client, "r,i,o", ...]."""
    if not isinstance(got, dict):  # (an empty Lua table encodes as [])
        return {}
    rows: dict[str, dict[str, Row]] = {}
    for g, flat in got.items():
        flat = flat if isinstance(flat, list) else []
        pairs = [(flat[i], flat[i + 1].split(",")) for i in range(0, len(flat), 2)]
        rows[g] = {c: (int(r), int(i), int(o)) for c, (r, i, o) in pairs}
    return rows
