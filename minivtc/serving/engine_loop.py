"""The engine in a background thread, for an asyncio server: one thread owns it, others ask.

Owns: `EngineLoop`, which runs `Engine.step()` in a loop on its own thread and is the only
code that touches the engine while it runs. Server handlers (on the asyncio event loop) never
call the engine: they send it *commands* — add a request, abort one, read a snapshot — which
the loop thread runs between two steps, and they receive each request's `StepOutput`s on an
`asyncio.Queue`. So the engine needs no locks, and a slow handler never stalls a step.

Does not own what the server reports about its requests (`server_stats.py`: the loop thread
tells it each request that ends and each client the engine forgets, and asks it for a
`Snapshot` between two steps), nor HTTP (`server.py`). Lesson 9 uses it.

    handler --command--> [queue] --(between steps)--> engine.add_request / abort / snapshot
    handler <--StepOutput-- asyncio.Queue <--call_soon_threadsafe-- engine.step()
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from minivtc.engine.engine import Engine, forget_idle_clients
from minivtc.engine.sampler import SamplingParams
from minivtc.requests.request import Request, StepOutput
from minivtc.serving.server_stats import ServerStats, Snapshot

__all__ = ["EngineLoop", "Stream"]


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
        self.stats = ServerStats(tenants)  # loop thread only; read through snapshot()
        self.commands: queue.SimpleQueue[tuple[Callable[[], object], Future]] = queue.SimpleQueue()
        # Held while a command is queued and while the loop closes: a command is either queued
        # before the loop's last drain (and answered by it) or refused (never left hanging).
        self.closing = threading.Lock()
        self.closed = False
        self.wakeup = threading.Event()
        self.streams: dict[str, Stream] = {}  # loop thread only
        self.error: BaseException | None = None
        self.stopping = False
        self.thread: threading.Thread | None = threading.Thread(
            target=self.run, name="minivtc-engine", daemon=True
        )

    def start(self) -> EngineLoop:
        """Run the loop on a thread of its own, unless `hold()` said the caller's thread will."""
        if self.thread is not None:
            self.thread.start()
        return self

    def hold(self) -> EngineLoop:
        """The calling thread will run the loop (`run()`), not a thread of its own; `start()`
        then does nothing. `minivtc serve` runs it so on its main thread, the one that loaded
        the model, so that torch's OpenMP workers answer to one thread only: once a second
        thread drives them (an engine thread, after the main thread's loading made a team of
        its own), GNU OpenMP counts more threads than CPUs and cuts its workers' spinning
        short, and each parallel product pays for waking them (the bench README measures it)."""
        self.thread = None
        return self

    def stop(self) -> None:
        self.stopping = True
        self.wakeup.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self.runs and self.error is None

    @property
    def runs(self) -> bool:
        """Its thread is alive, or (held) `run()` has not ended: a command sent now is answered."""
        if self.thread is not None:
            return self.thread.is_alive()
        return not self.closed

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

        try:
            return await self.call(add)
        except asyncio.CancelledError:  # its caller left: if the request was queued, end it
            self.abort(request_id)
            raise

    def abort(self, request_id: str) -> None:
        """Abort without waiting: safe in a `finally` of a cancelled handler."""
        self.send(lambda: self.forget(request_id, abort=True))

    async def call(self, fn: Callable[[], object]):
        """Run `fn()` on the loop thread between two steps; return (or raise) its result.
        Raises RuntimeError if the loop is not running (or stops before it runs `fn`). A call
        cancelled before its turn never runs `fn`."""
        return await asyncio.wrap_future(self.send(fn))

    def send(self, fn: Callable[[], object]) -> Future:
        future: Future = Future()
        with self.closing:
            if self.closed or not self.runs or self.error is not None:
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
            if not future.set_running_or_notify_cancel():
                continue  # its caller gave up while it waited (a cancelled `call`): not run
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
                self.stats.record(request)
                self.forget(request.request_id, abort=False)
        for event_loop, items in by_loop.items():  # one wake-up per event loop per step
            if not post(event_loop, put_all, items):  # its caller's event loop has closed:
                for request_id, stream in list(self.streams.items()):  # nobody will read
                    if stream.event_loop is event_loop:
                        self.forget(request_id, abort=True)

    def forget_idle_clients(self) -> list[str]:
        """Between steps: forget idle clients; the statistics keep their totals."""
        self.next_forget = time.monotonic() + self.forget_every_s
        gone = forget_idle_clients(self.engine)
        self.stats.forget(gone)
        return list(gone)

    def snapshot(self) -> Snapshot:
        """What the reports need, copied between two steps (run it on the loop thread)."""
        return self.stats.snapshot(self.engine)

    def forget(self, request_id: str, abort: bool) -> None:
        stream = self.streams.pop(request_id, None)
        if abort and stream is not None and not stream.request.is_finished:
            self.engine.abort(request_id)
            self.stats.record(stream.request)


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
