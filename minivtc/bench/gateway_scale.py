"""`minivtc bench gateways`: do k gateways sharing a store pass k times one gateway's streams?

Owns the measurement of the fleet's scale-out (minivtc/fleet/README.md): a redis-server of its
own (loopback, a random password, no persistence), N stand-in backends
(`gateway_overhead.standin_app`: T one-token chunks, PACE seconds apart, no model), and for
each k of `--gateways`, k `minivtc route --store` processes (a fresh key prefix each time) in
front of them, with budgets no request waits for (every request still books and releases its
room in the store). S streams, each a loop of one request after another, the i-th through
gateway i mod k, from D load-generator processes (default one per gateway), run for a warm-up
and then `--seconds` measured. For each k it prints:

- streams served per second (requests completed in the window) and output tokens per second,
  their ratio to k = 1 and that ratio over k (the goal: >= 0.9 up to the machine's cores);
- the store's round trips and commands per request, from Redis' INFO commandstats before and
  after the window (a round trip: a script call, a transaction, a ping; the commands count
  those a script runs inside the server too);
- the CPU seconds each process used in the window (each gateway; the stand-ins, the load
  generators and the store together), beside the machine's cores: whether the gateways were
  the limit, or the rest of the machine.

The stand-ins cap the streams at S / (T x PACE) a second; the ceiling is printed, and a k that
reaches it measured the stand-ins, not the gateways. Progress goes to stderr, the tables to
stdout. Measurements belong in minivtc/bench/README.md, made on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

import httpx

from minivtc.bench import timing
from minivtc.bench.gateway_overhead import start_backends, start_route, stop
from minivtc.gateway.proxy import free_port, wait_healthy

__all__ = ["main"]

ROUND_TRIPS = ("evalsha", "eval", "exec", "ping")  # commands that are one round trip each
OURS = ("info", "client", "hello", "auth")  # (connecting, and this benchmark's own questions)
CLIENTS = 16  # the streams' tenants, in turn (each client's requests in flight are capped)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="minivtc bench gateways",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--gateways", type=timing.counts, default=[1, 2], help="the k to run, e.g. 1,2,4 (1,2)"
    )
    parser.add_argument("--streams", type=int, default=64, help="S, streams at once (64)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured per k (10)")
    parser.add_argument("--warmup", type=float, default=2.0, help="before measuring (2)")
    parser.add_argument("--backends", type=int, default=2, help="N stand-in backends (2)")
    parser.add_argument("--tokens", type=int, default=16, help="T, a stand-in's chunks (16)")
    parser.add_argument("--pace", type=float, default=0.01, help="seconds between them (0.01)")
    parser.add_argument("--sync", type=float, default=0.05, help="the gateways' --sync (0.05)")
    parser.add_argument("--drivers", type=int, default=None, help="load generators (k)")
    args = parser.parse_args(argv)
    ks = args.gateways
    if args.streams < 1 or args.backends < 1 or args.tokens < 1:
        parser.error("--streams, --backends and --tokens: at least 1")
    if not args.seconds > 0 or args.warmup < 0 or args.pace < 0:
        parser.error("--seconds > 0, --warmup and --pace >= 0")
    if shutil.which("redis-server") is None:
        print(
            "redis-server is not installed (Debian: apt-get install redis-server)", file=sys.stderr
        )
        return 1
    return bench_gateways(ks, args)


def bench_gateways(ks: list[int], args) -> int:
    say(f"starting a store and {args.backends} stand-in backends")
    store, url = start_store()
    backends, standins = start_backends(args.backends, args.pace, args.tokens)
    rows = []
    try:
        for url_ in backends:
            wait_healthy(url_)
        for k in ks:
            rows.append(run_k(k, url, backends, [p.pid for p in standins], store.pid, args))
    finally:
        stop([*standins, store])
    report(rows, args)
    return 0


def run_k(k: int, store_url: str, backends: list[str], standins: list[int], store: int, args):
    """k gateways, the load through them, and what each process used in the window."""
    say(f"k = {k}: starting {k} gateway(s)")
    prefix = f"bench-{k}-{secrets.token_hex(3)}"
    env = {"MINIVTC_STORE": store_url}  # (an environment variable: `ps` shows no password)
    options = ("--store-prefix", prefix, "--sync", str(args.sync))
    logs = [tempfile.TemporaryFile("w+") for _ in range(k)]  # (their stderr: read if one fails)
    started = [start_route(backends, *options, env=env, stderr=log) for log in logs]
    urls, gateways = [url for url, _ in started], [proc for _, proc in started]
    drivers: list[subprocess.Popen] = []
    try:
        for url, proc, log in zip(urls, gateways, logs, strict=True):
            try:
                wait_healthy(url, proc=proc)
            except RuntimeError:
                log.seek(0)
                say(log.read()[-2000:])
                raise
        begin = time.time() + 1.0 + args.warmup  # (the drivers import first)
        end = begin + args.seconds
        plan = {"urls": urls, "streams": args.streams, "begin": begin, "end": end}
        n = args.drivers or k
        say(f"k = {k}: {args.streams} streams from {n} load generator(s), {args.seconds:g} s")
        for d in range(n):
            job = json.dumps(plan | {"driver": d, "drivers": n})
            code = f"from {__name__} import drive; drive({job!r})"
            drivers.append(
                subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
            )
        pids = {"gateways": [g.pid for g in gateways], "standins": standins}
        pids |= {"drivers": [d.pid for d in drivers], "store": [store]}
        time.sleep(max(begin - time.time(), 0.0))
        cpu0, ops0 = cpu_of(pids), commandstats(store_url)
        time.sleep(max(end - time.time(), 0.0))
        cpu1, ops1 = cpu_of(pids), commandstats(store_url)
        counts = [json.loads(d.communicate(timeout=60 + args.seconds)[0]) for d in drivers]
    finally:
        stop([*drivers, *gateways])
        for log in logs:
            log.close()
    cpu = {who: [b - a for a, b in zip(cpu0[who], cpu1[who], strict=True)] for who in cpu0}
    calls = {c: ops1.get(c, 0) - ops0.get(c, 0) for c in ops1}
    return k, counts, cpu, calls


# --- the load generator (a process of its own) ---------------------------------------------------


def drive(job: str) -> None:
    """One load generator: its share of the streams (the i-th through gateway i mod k), each
    a loop of one request after another until `end`; prints what ended in [begin, end)."""
    plan = json.loads(job)
    print(json.dumps(asyncio.run(streams(plan))), flush=True)


async def streams(plan: dict) -> dict:
    urls, got = plan["urls"], {"requests": 0, "tokens": 0, "errors": 0}
    mine = range(plan["driver"], plan["streams"], plan["drivers"])
    limits = httpx.Limits(max_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:

        async def one(i: int) -> None:
            body = {"prompt": "x", "max_tokens": 64, "stream": True, "user": f"c{i % CLIENTS}"}
            while time.time() < plan["end"]:
                url = urls[i % len(urls)] + "/v1/completions"
                tokens = 0
                try:
                    async with client.stream("POST", url, json=body) as r:
                        async for line in r.aiter_lines():
                            tokens += '"text"' in line  # (a chunk with a choice)
                        ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if plan["begin"] <= time.time() < plan["end"]:
                    got["requests"] += ok
                    got["tokens"] += tokens if ok else 0
                    got["errors"] += not ok

        await asyncio.gather(*(one(i) for i in mine))
    return got


# --- what the processes and the store used -----------------------------------------------------


def cpu_of(pids: dict[str, list[int]]) -> dict[str, list[float]]:
    """Each process's CPU seconds so far (user + system, Linux's /proc)."""
    return {who: [cpu_seconds(p) for p in ps] for who, ps in pids.items()}


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # (after the command's name)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def commandstats(url: str) -> dict[str, int]:
    """Redis' calls per command since it started (INFO commandstats)."""
    import redis

    with redis.Redis.from_url(url) as r:
        info = r.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in info.items()}


def start_store() -> tuple[subprocess.Popen, str]:
    """A redis-server of the benchmark's own: the process and its URL."""
    port, password = free_port(), secrets.token_hex(8)
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    args += ["--appendonly", "no", "--requirepass", password]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    url = f"redis://:{password}@127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while True:
        try:
            commandstats(url)
            return proc, url
        except Exception:  # (any failure to answer yet: refused, loading)
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("redis-server did not start") from None
            time.sleep(0.05)


# --- the report ----------------------------------------------------------------------------------


def report(rows: list, args) -> None:
    cores = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    ceiling = args.streams / (args.tokens * args.pace) if args.pace else float("inf")
    print(f"machine: {cores} cores ({usable} usable here)")
    print(
        f"{args.backends} stand-in backend(s): {args.tokens} tokens, {args.pace:g} s apart "
        f"(their ceiling: {args.streams} streams / {args.tokens * args.pace:g} s = "
        f"{ceiling:.0f} streams/s); {args.streams} streams, {args.seconds:g} s measured after "
        f"{args.warmup:g} s of warm-up; the gateways' --sync {args.sync:g} s"
    )
    print(
        f"{'k':>3} {'streams/s':>10} {'tokens/s':>10} {'vs k=1':>7} {'/ k':>6} "
        f"{'trips/req':>10} {'cmds/req':>9} {'errors':>7}  limit"
    )
    first = None
    for k, counts, cpu, calls in rows:
        served = sum(c["requests"] for c in counts)
        rate, tokens = served / args.seconds, sum(c["tokens"] for c in counts) / args.seconds
        first = first or rate
        ratio = rate / first if first else 0.0
        trips = sum(calls.get(c, 0) for c in ROUND_TRIPS)
        commands = sum(n for c, n in calls.items() if not c.startswith(OURS))
        per = max(served, 1)
        print(
            f"{k:>3} {rate:>10.1f} {tokens:>10.0f} {ratio:>7.2f} {ratio / k:>6.2f} "
            f"{trips / per:>10.2f} {commands / per:>9.1f} {sum(c['errors'] for c in counts):>7}"
            f"  {limit(rate, ceiling, sum(map(sum, cpu.values())), usable * args.seconds)}"
        )
    print(f"CPU seconds in the {args.seconds:g} s window ({cores * args.seconds:g} core-seconds):")
    print(
        f"{'k':>3} {'each gateway':>24} {'stand-ins':>10} {'load gen.':>10} {'store':>7} {'all':>7}"
    )
    for k, _, cpu, _ in rows:
        each = " ".join(f"{s:.2f}" for s in cpu["gateways"])
        parts = [sum(cpu[w]) for w in ("standins", "drivers", "store")]
        total = sum(cpu["gateways"]) + sum(parts)
        print(
            f"{k:>3} {each:>24} {parts[0]:>10.2f} {parts[1]:>10.2f} {parts[2]:>7.2f} {total:>7.2f}"
        )


def limit(rate: float, ceiling: float, used: float, cores: float) -> str:
    """What a row's rate may have hit, so that no one reads it as the gateways' ceiling."""
    if rate >= 0.9 * ceiling:
        return "the stand-ins' pace (raise --streams)"
    if used >= 0.9 * cores:
        return "the machine's cores (all busy)"
    return "-"


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
