"""The engine in a background thread, for an asyncio server: one thread owns it, others ask.

Owns: `EngineLoop`, which runs `Engine.step()` in a loop on its own thread and is the only
code that touches the engine while it runs. Server handlers (on the asyncio event loop) never
call the engine: they send it *commands* — add a request, abort one, read a snapshot — which
the loop thread runs between two steps, and they receive each request's `StepOutput`s on an
`asyncio.Queue`. So the engine needs no locks, and a slow handler never stalls a step.

Also owns what the server reports about finished requests: first-token and end-to-end latency
histograms, each client's times to first token (the dashboard's mean and recent) and finish
counts per client. Does not own HTTP (`server.py`). Lesson 8 uses it.

    handler --command--> [queue] --(between steps)--> engine.add_request / abort / snapshot
    handler <--StepOutput-- asyncio.Queue <--call_soon_threadsafe-- engine.step()
"""

from __future__ import annotations

import asyncio
import bisect
import queue
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field

import torch

from minivtc.engine.engine import Engine, forget_idle_clients
from minivtc.engine.sampler import SamplingParams
from minivtc.serving.snapshot import OTHER, ClientRow, FirstTokens, Snapshot
from minivtc.vocab.request import Request, StepOutput

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)  # seconds


@dataclass
class Histogram:
    """A Prometheus histogram: counts per upper bound (`le`), plus the sum and count."""

    bounds: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(init=False)  # one per bound, and one for +Inf
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le is inclusive
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, count of observations <= le) for every bound and +Inf, as Prometheus writes it."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return out


@dataclass
class Stream:
    """One live request as the server sees it: where its outputs go."""

    request: Request
    outputs: asyncio.Queue  # StepOutput items; an Exception item if the engine loop died
    event_loop: asyncio.AbstractEventLoop


class EngineLoop:
    """Runs `engine` on a daemon thread until `stop()`. Every public method is thread-safe."""

    def __init__(
        self,
        engine: Engine,
        idle_wait_s: float = 0.05,
        on_fatal: Callable[[BaseException], None] | None = None,
        forget_every_s: float = 10.0,
        tenants: dict[str, float] | None = None,
    ) -> None:
        """`on_fatal(error)` runs on the loop thread if the engine fails in a way that leaves
        shared state unsound (the loop has ended; `minivtc serve` then exits non-zero).
        Every `forget_every_s` the loop forgets idle clients (`engine.forget_idle_clients`),
        except that `tenants` (client -> weight: the API keys' clients, a fixed set, so
        forgetting them saves nothing) keep their rows and totals for the life of the loop."""
        self.engine = engine
        self.idle_wait_s = idle_wait_s
        self.on_fatal = on_fatal
        self.forget_every_s = forget_every_s
        self.next_forget = time.monotonic() + forget_every_s
        self.forgotten = ClientRow()  # token totals of forgotten clients (monotone metrics)
        self.tenants = dict(tenants or {})
        # A tenant's totals from before the engine last forgot it (loop thread only): the
        # engine counts afresh when it comes back, and the sum only ever grows.
        self.kept = {c: ClientRow(None, weight) for c, weight in self.tenants.items()}
        self.commands: queue.SimpleQueue[tuple[Callable[[], object], Future]] = queue.SimpleQueue()
        # Held while a command is queued and while the loop closes: a command is either queued
        # before the loop's last drain (and answered by it) or refused (never left hanging).
        self.closing = threading.Lock()
        self.closed = False
        self.wakeup = threading.Event()
        self.streams: dict[str, Stream] = {}  # loop thread only
        self.ttft = Histogram()  # loop thread only; read through snapshot()
        self.first_tokens: dict[str, FirstTokens] = {}  # the same, per client (the dashboard)
        self.latency = Histogram()
        self.finished: dict[tuple[str, str], int] = {}  # (client, finish reason) -> count
        self.error: BaseException | None = None
        self.stopping = False
        self.thread = threading.Thread(target=self.run, name="minivtc-engine", daemon=True)

    def start(self) -> EngineLoop:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping = True
        self.wakeup.set()
        self.thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and self.error is None

    # --- called from the event loop ---------------------------------------------------------

    async def add(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        client_id: str,
        request_id: str,
        cache_salt: str | None = None,
    ) -> Stream:
        """Queue a request; raises `RequestRejected` exactly as `Engine.add_request` would."""
        event_loop = asyncio.get_running_loop()

        def add() -> Stream:
            request = self.engine.add_request(
                prompt_ids, params, client_id, request_id, cache_salt=cache_salt
            )
            stream = Stream(request, asyncio.Queue(), event_loop)
            self.streams[request_id] = stream
            return stream

        return await self.call(add)

    def abort(self, request_id: str) -> None:
        """Abort without waiting: safe in a `finally` of a cancelled handler."""
        self.send(lambda: self.forget(request_id, abort=True))

    async def call(self, fn: Callable[[], object]):
        """Run `fn()` on the loop thread between two steps; return (or raise) its result.
        Raises RuntimeError if the loop is not running (or stops before it runs `fn`)."""
        return await asyncio.wrap_future(self.send(fn))

    def send(self, fn: Callable[[], object]) -> Future:
        future: Future = Future()
        with self.closing:
            if self.closed or not self.thread.is_alive() or self.error is not None:
                future.set_exception(self.not_running())
                return future
            self.commands.put((fn, future))
        self.wakeup.set()
        return future

    def fail_all(self, reason: str) -> None:
        """End every live request now with an error (the server's shutdown timeout)."""

        def fail() -> None:
            for request_id, stream in list(self.streams.items()):
                self.forget(request_id, abort=True)
                out = StepOutput(request_id, -1, "", True, "error", reason)
                post(stream.event_loop, stream.outputs.put_nowait, out)

        self.send(fail)

    def not_running(self) -> RuntimeError:
        return RuntimeError(f"the engine loop is not running ({self.error!r})")

    # --- the loop thread ----------------------------------------------------------------------

    def run(self) -> None:
        try:
            with torch.inference_mode():
                while not self.stopping:
                    self.run_commands()
                    if time.monotonic() >= self.next_forget:
                        self.forget_idle_clients()
                    if self.engine.has_unfinished():
                        self.deliver(self.engine.step())
                    else:
                        self.wakeup.wait(self.idle_wait_s)  # idle: sleep until a command
                        self.wakeup.clear()
        except BaseException as e:
            # Not one request's fault (those end alone, inside Engine.step): the forward pass,
            # the pool or the scheduler failed, and the engine can no longer be trusted.
            self.error = e
            for stream in self.streams.values():
                post(stream.event_loop, stream.outputs.put_nowait, e)
            traceback.print_exc()  # the server's log says why
        finally:
            with self.closing:
                self.closed = True
                self.run_commands()  # answer what is queued; later commands are refused
        if self.error is not None and self.on_fatal is not None:
            self.on_fatal(self.error)

    def run_commands(self) -> None:
        while True:
            try:
                fn, future = self.commands.get_nowait()
            except queue.Empty:
                return
            if self.error is not None:
                future.set_exception(self.not_running())
                continue
            try:
                future.set_result(fn())
            except Exception as e:  # RequestRejected and the like go back to the handler
                future.set_exception(e)

    def deliver(self, ran: list[Request]) -> None:
        """Each request that ran gets its StepOutput on its stream's queue."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, StepOutput]]] = {}
        for request in ran:
            stream = self.streams.get(request.request_id)
            if stream is None:
                continue
            out = self.engine.output(request)  # its text so far (or its own failure)
            by_loop.setdefault(stream.event_loop, []).append((stream.outputs, out))
            if out.finished:
                self.record(request)
                self.forget(request.request_id, abort=False)
        for event_loop, items in by_loop.items():  # one wake-up per event loop per step
            if not post(event_loop, put_all, items):  # its caller's event loop has closed:
                for request_id, stream in list(self.streams.items()):  # nobody will read
                    if stream.event_loop is event_loop:
                        self.forget(request_id, abort=True)

    def forget_idle_clients(self) -> list[str]:
        """Between steps: forget idle clients; their totals move to `forgotten`."""
        self.next_forget = time.monotonic() + self.forget_every_s
        gone = forget_idle_clients(self.engine)
        for client, tokens in gone.items():
            row = self.kept.get(client, self.forgotten)
            row.input_tokens += tokens.num_input
            row.output_tokens += tokens.num_output
        for client in [c for c in gone if c not in self.tenants]:
            self.first_tokens.pop(client, None)
        for key in [k for k in self.finished if k[0] in gone and k[0] not in self.tenants]:
            other = (OTHER, key[1])
            self.finished[other] = self.finished.get(other, 0) + self.finished.pop(key)
        return list(gone)

    def snapshot(self) -> Snapshot:
        """What the reports need, copied between two steps (run it on the loop thread)."""
        engine = self.engine
        rows: dict[str, ClientRow] = {}
        for client, (counter, weight) in engine.scheduler.accounts().items():
            rows[client] = ClientRow(counter, weight)
        for client, tokens in engine.client_tokens.items():
            row = rows.setdefault(client, ClientRow())
            row.input_tokens, row.output_tokens = tokens.num_input, tokens.num_output
        for client, kept in self.kept.items():  # (counter None: the scheduler forgot it, idle)
            row = rows.setdefault(client, ClientRow(None, kept.weight))
            row.input_tokens += kept.input_tokens
            row.output_tokens += kept.output_tokens
        for r in engine.scheduler.waiting():
            rows.setdefault(r.client_id, ClientRow()).waiting += 1
        for r in engine.running:
            rows.setdefault(r.client_id, ClientRow()).running += 1
        held: dict[str, set[int]] = {}  # per client, the KV blocks its requests hold
        for request_id, table in engine.allocator.block_tables.items():
            if request_id in engine.requests:
                held.setdefault(engine.requests[request_id].client_id, set()).update(table)
        for client, blocks in held.items():
            rows.setdefault(client, ClientRow()).blocks = len(blocks)
        a = engine.allocator
        return Snapshot(
            scheduler=engine.scheduler.name,
            clients=rows,
            used_blocks=a.num_used_blocks,
            total_blocks=a.num_blocks,
            block_size=a.block_size,
            finished=dict(self.finished),
            ttft=self.ttft.cumulative(),
            ttft_sum=self.ttft.total,
            latency=self.latency.cumulative(),
            latency_sum=self.latency.total,
            forgotten=ClientRow(
                None, 1.0, 0, 0, self.forgotten.input_tokens, self.forgotten.output_tokens
            ),
            **asdict(engine.stats()),  # preemptions, recomputed/swapped/cached/host tokens
            tenants=tuple(self.tenants),
            first_tokens={c: f.copy() for c, f in self.first_tokens.items()},
            taken=time.monotonic(),
        )

    def record(self, request: Request) -> None:
        if request.first_token_time is not None:
            ttft = request.first_token_time - request.arrival_time
            self.ttft.observe(ttft)
            self.first_tokens.setdefault(request.client_id, FirstTokens()).observe(ttft)
        if request.finish_time is not None:
            self.latency.observe(request.finish_time - request.arrival_time)
        key = (request.client_id, request.finish_reason or "")
        self.finished[key] = self.finished.get(key, 0) + 1

    def forget(self, request_id: str, abort: bool) -> None:
        stream = self.streams.pop(request_id, None)
        if abort and stream is not None and not stream.request.is_finished:
            self.engine.abort(request_id)
            self.record(stream.request)


def post(event_loop: asyncio.AbstractEventLoop, fn, *args) -> bool:
    """Run `fn(*args)` on `event_loop` soon; False if that loop has closed (its caller left
    without a goodbye, e.g. `asyncio.run` returned): that is the caller's end, not the engine's."""
    try:
        event_loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        return False
    return True


def put_all(items: list[tuple[asyncio.Queue, StepOutput]]) -> None:
    for outputs, out in items:
        outputs.put_nowait(out)
