"""The engine on its own thread (`engine_loop.py`), driven as the server drives it: commands from
an asyncio event loop (and from other threads), each request's outputs on its own queue.

A tiny random model (`TINY_GQA`) runs real steps on the CPU; the tokens a stream receives are
checked against the plain one-request generation loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from minivtc.engine.engine import RequestRejected, StepOutput
from minivtc.engine.factory import build_engine
from minivtc.engine.generate import generate_plain
from minivtc.engine.sampler import SamplingParams
from minivtc.model.llama import Llama
from minivtc.serving.engine_loop import EngineLoop
from minivtc.serving.server_stats import LATENCY_BUCKETS, OTHER, Histogram
from tests.conftest import TINY_GQA

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
LONG = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
TIMEOUT_S = 20


@pytest.fixture(scope="module")
def tiny() -> Llama:
    torch.manual_seed(0)
    return Llama(TINY_GQA).eval()


@pytest.fixture
def make_loop(tiny):
    """EngineLoops over fresh engines of the tiny model; each stopped at the end of the test."""
    made: list[EngineLoop] = []

    def make(scheduler: str = "fcfs", **options) -> EngineLoop:
        engine = build_engine(
            tiny, None, scheduler, kv_tokens=512, block_size=4, check_invariants=True, **options
        )
        made.append(EngineLoop(engine, idle_wait_s=0.01, forget_every_s=3600))
        return made[-1]

    yield make
    for loop in made:
        if loop.thread is not None and loop.thread.is_alive():
            loop.stop()


def prompt(seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(
        3, 4096, (int(torch.randint(1, 30, (1,), generator=gen)),), generator=gen
    ).tolist()


async def next_output(stream) -> StepOutput:
    out = await asyncio.wait_for(stream.outputs.get(), TIMEOUT_S)
    if isinstance(out, BaseException):
        raise out
    return out


async def collect(stream) -> list[StepOutput]:
    outs = [await next_output(stream)]
    while not outs[-1].finished:
        outs.append(await next_output(stream))
    return outs


async def until(loop: EngineLoop, check) -> None:
    """Ask the loop thread `check()` between steps until it holds."""
    for _ in range(TIMEOUT_S * 100):
        if await loop.call(check):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the engine loop never reached the expected state")


def pool_is_free(loop: EngineLoop):
    a = loop.engine.allocator
    return lambda: a.num_free_blocks == a.num_blocks and not loop.engine.requests


def test_each_stream_gets_its_tokens_in_order_ending_finished(make_loop, tiny):
    """Six requests from two clients at once: each stream carries exactly the tokens of
    one-at-a-time generation, in order, every output unfinished but the last."""
    loop = make_loop().start()
    prompts = [prompt(i) for i in range(6)]

    async def main() -> list[list[StepOutput]]:
        streams = [await loop.add(p, GREEDY, "ab"[i % 2], f"r{i}") for i, p in enumerate(prompts)]
        outputs = await asyncio.gather(*(collect(s) for s in streams))
        await until(loop, pool_is_free(loop))
        return outputs

    for i, (p, outs) in enumerate(zip(prompts, asyncio.run(main()), strict=True)):
        assert [o.token_id for o in outs] == list(generate_plain(tiny, p, GREEDY))
        assert {o.request_id for o in outs} == {f"r{i}"}
        assert [o.finished for o in outs] == [False] * 7 + [True]
        assert outs[-1].finish_reason == "length"
    assert loop.snapshot().finished == {("a", "length"): 3, ("b", "length"): 3}


def test_a_held_loop_runs_on_the_thread_that_calls_run(make_loop, tiny):
    """`hold()`: no thread of its own, `start()` does nothing, and the thread that calls `run()`
    (`minivtc serve`'s main thread, the one that loaded the model) runs every step and command;
    `stop()` from elsewhere ends `run()`, and later commands are refused."""
    loop = make_loop().hold()
    assert loop.start() is loop and loop.thread is None
    host = threading.Thread(target=loop.run, name="host")
    host.start()

    async def main() -> tuple[threading.Thread, list[StepOutput]]:
        outs = await collect(await loop.add(prompt(0), GREEDY, "a", "r0"))
        return await loop.call(threading.current_thread), outs

    ran_on, outs = asyncio.run(main())
    assert ran_on is host and loop.alive
    assert [o.token_id for o in outs] == list(generate_plain(tiny, prompt(0), GREEDY))
    loop.stop()
    host.join(timeout=TIMEOUT_S)
    assert not host.is_alive() and not loop.alive
    with pytest.raises(RuntimeError, match="not running"):
        loop.send(lambda: None).result(timeout=TIMEOUT_S)


def test_a_refused_command_raises_in_its_caller_and_the_loop_serves_on(make_loop):
    loop = make_loop().start()

    async def main() -> None:
        with pytest.raises(RequestRejected, match="the prompt is empty"):
            await loop.add([], GREEDY, "a", "empty")
        with pytest.raises(RequestRejected, match="already in use"):
            first = await loop.add([5, 6], LONG, "a", "same")
            await loop.add([5, 6], GREEDY, "a", "same")
        loop.abort(first.request.request_id)
        assert loop.alive
        assert len(await collect(await loop.add([5, 6], GREEDY, "a", "next"))) == 8
        await until(loop, pool_is_free(loop))

    asyncio.run(main())


def test_commands_run_on_the_loop_thread_between_steps(make_loop):
    loop = make_loop()
    in_step, step = [False], loop.engine.step

    def watched_step():
        in_step[0] = True
        try:
            return step()
        finally:
            in_step[0] = False

    loop.engine.step = watched_step
    loop.start()

    async def main() -> list[tuple[threading.Thread, bool]]:
        streams = [await loop.add(prompt(i), LONG, "a", f"r{i}") for i in range(3)]
        seen = []
        for _ in range(50):
            seen.append(await loop.call(lambda: (threading.current_thread(), in_step[0])))
        for s in streams:
            loop.abort(s.request.request_id)
        await until(loop, pool_is_free(loop))  # no output left for a closed event loop
        return seen

    seen = asyncio.run(main())
    assert {thread for thread, _ in seen} == {loop.thread}
    assert not any(during for _, during in seen)


def test_an_abort_from_another_thread_frees_the_blocks(make_loop):
    """One running request and one waiting (max_running=1), both aborted from a plain thread:
    the batch, the queue and the pool are empty again, and both aborts are counted."""
    loop = make_loop(max_running=1).start()

    async def main() -> None:
        running = await loop.add(prompt(1), LONG, "a", "running")
        waiting = await loop.add(prompt(2), LONG, "b", "waiting")
        await next_output(running)  # it is in the batch now
        assert await loop.call(lambda: loop.engine.allocator.num_used_blocks > 0)
        for stream in (running, waiting):
            aborter = threading.Thread(target=loop.abort, args=(stream.request.request_id,))
            aborter.start()
            aborter.join()
        await until(loop, pool_is_free(loop))
        assert await loop.call(lambda: loop.engine.scheduler.num_waiting) == 0

    asyncio.run(main())
    assert loop.snapshot().finished == {("a", "abort"): 1, ("b", "abort"): 1}


def test_fail_all_ends_every_live_request_with_an_error(make_loop):
    loop = make_loop().start()

    async def main() -> list[StepOutput]:
        streams = [await loop.add(prompt(i), LONG, "a", f"r{i}") for i in range(2)]
        loop.fail_all("the server shut down")
        last = [(await collect(s))[-1] for s in streams]
        await until(loop, pool_is_free(loop))
        return last

    for out in asyncio.run(main()):
        assert out.finished and out.finish_reason == "error"
        assert out.error == "the server shut down"


def test_snapshot_counts_waiting_and_running_per_client(make_loop):
    """Taken between two steps (here, with the loop not started: this thread is its owner)."""
    loop = make_loop("vtc", max_running=3, weights={"a": 2.0})
    engine = loop.engine
    for i, client in enumerate("aaabbc"):
        engine.add_request(prompt(i), GREEDY, client, f"r{i}")
    engine.step()
    snap = loop.snapshot()
    waiting = Counter(r.client_id for r in engine.scheduler.waiting())
    running = Counter(r.client_id for r in engine.running)
    assert sum(running.values()) == 3 and sum(waiting.values()) == 3
    assert snap.clients.keys() == {"a", "b", "c"}
    for client, row in snap.clients.items():
        assert (row.waiting, row.running) == (waiting[client], running[client])
        assert (row.counter, row.weight) == engine.scheduler.ledger.accounts()[client]
        tokens = engine.client_tokens.get(client)
        assert (row.input_tokens, row.output_tokens) == (
            (tokens.num_input, tokens.num_output) if tokens else (0, 0)
        )
    assert snap.clients["a"].weight == 2.0 and snap.scheduler == "vtc"
    assert snap.used_blocks == engine.allocator.num_used_blocks > 0
    held = Counter()  # each client's blocks (no prefix caching here: none shared)
    for r in engine.running:
        held[r.client_id] += len(engine.allocator.block_tables[r.request_id])
    assert {c: row.blocks for c, row in snap.clients.items() if row.blocks} == dict(held)
    assert sum(held.values()) == snap.used_blocks


def test_forgotten_clients_totals_move_to_forgotten(make_loop):
    """Idle clients are forgotten (FCFS keeps nothing per client); a busy one is kept. Their
    tokens and finish counts are summed under forgotten and (other): no total shrinks."""
    loop = make_loop().start()

    async def main():
        for i, client in enumerate("aab"):
            await collect(await loop.add(prompt(i), GREEDY, client, f"r{i}"))
        busy = await loop.add(prompt(9), LONG, "c", "busy")
        await next_output(busy)
        # One command, queued while c has ~200 tokens to go: c is still running when it runs.
        report = await loop.call(
            lambda: (loop.snapshot(), loop.forget_idle_clients(), loop.snapshot())
        )
        loop.abort("busy")
        await until(loop, pool_is_free(loop))
        return report

    before, gone, after = asyncio.run(main())
    assert sorted(gone) == ["a", "b"] and set(after.clients) == {"c"}
    for field in ("input_tokens", "output_tokens"):
        forgotten = sum(getattr(before.clients[c], field) for c in gone)
        assert getattr(after.forgotten, field) == forgotten > 0
        assert getattr(loop.stats.forgotten, field) == forgotten
    assert after.finished == {(OTHER, "length"): 3}


@given(st.lists(st.one_of(st.sampled_from(LATENCY_BUCKETS), st.floats(0, 500)), max_size=40))
def test_histogram_buckets_are_cumulative_and_inclusive(values):
    histogram = Histogram()
    for v in values:
        histogram.observe(v)
    buckets = histogram.cumulative()
    assert [le for le, _ in buckets] == [repr(b) for b in LATENCY_BUCKETS] + ["+Inf"]
    assert [n for _, n in buckets] == [sum(v <= b for v in values) for b in LATENCY_BUCKETS] + [
        len(values)
    ]
    assert histogram.count == len(values) and histogram.total == pytest.approx(sum(values))


def test_a_histogram_with_its_own_bounds():
    histogram = Histogram(bounds=(1.0, 2.0))
    histogram.observe(1.5)
    assert histogram.cumulative() == [("1.0", 0), ("2.0", 1), ("+Inf", 1)]


def test_a_loop_that_died_refuses_every_later_command(make_loop):
    """A fault beyond one request ends the loop: live streams get the error, on_fatal runs once,
    and every later command raises RuntimeError instead of waiting forever."""
    fatal: list[BaseException] = []
    loop = make_loop()
    loop.on_fatal = fatal.append
    loop.start()

    def break_the_engine() -> None:
        def step():
            raise RuntimeError("boom")

        loop.engine.step = step

    async def main() -> None:
        stream = await loop.add(prompt(1), LONG, "a", "live")
        await next_output(stream)
        await loop.call(break_the_engine)
        with pytest.raises(RuntimeError, match="boom"):
            await collect(stream)  # the error itself arrives on the stream
        loop.thread.join(TIMEOUT_S)
        for command in (lambda: 1, loop.snapshot):
            with pytest.raises(RuntimeError, match="the engine loop is not running.*boom"):
                await asyncio.wait_for(loop.call(command), TIMEOUT_S)  # answered, not left hanging
        with pytest.raises(RuntimeError, match="not running"):
            await asyncio.wait_for(loop.add(prompt(2), GREEDY, "a", "late"), TIMEOUT_S)
        loop.abort("live")  # never raises: safe in a handler's finally
        assert loop.send(lambda: 1).exception() is not None

    asyncio.run(main())
    assert not loop.alive and len(fatal) == 1 and "boom" in repr(fatal[0])


def test_a_call_cancelled_while_it_waits_is_not_run_and_the_loop_serves_on(make_loop):
    """A caller that gives up (its task cancelled: a timeout, a shutdown) while its command
    waits behind another: the command never runs, and the loop, untouched, answers the next
    (a command answered after its caller left once ended the engine loop)."""
    loop = make_loop().start()
    gate, ran = threading.Event(), []

    async def main() -> int:
        loop.send(lambda: gate.wait(TIMEOUT_S))  # the loop thread is busy with this one
        waiting = asyncio.ensure_future(loop.call(lambda: ran.append(1)))
        await asyncio.sleep(0.05)
        waiting.cancel()
        await asyncio.sleep(0.05)  # (the cancellation reaches the command's future)
        gate.set()
        return await asyncio.wait_for(loop.call(lambda: 7), TIMEOUT_S)

    assert asyncio.run(main()) == 7
    assert loop.alive and loop.error is None and ran == []


def test_an_add_whose_caller_left_once_it_ran_is_aborted(make_loop):
    """Cancelled after the engine took the request: the request is aborted at once (nobody
    reads its stream), its blocks freed, as a client that goes away mid-stream."""
    loop = make_loop().start()
    gate, leaving, left = threading.Event(), threading.Event(), threading.Event()

    async def main() -> None:
        loop.send(lambda: gate.wait(TIMEOUT_S))  # the loop thread is busy with this one
        adding = asyncio.ensure_future(loop.add(prompt(3), LONG, "a", "left"))
        await asyncio.sleep(0.05)

        def leave_then_linger() -> None:  # on the loop thread, after the add: the caller leaves
            adding.get_loop().call_soon_threadsafe(adding.cancel)
            leaving.set()
            left.wait(TIMEOUT_S)  # no step runs until the caller has gone (its abort queued)

        loop.send(leave_then_linger)
        gate.set()
        # This event loop blocks (no await) until both the add's answer and the cancellation
        # wait in its queue: the caller leaves after the engine took the request and before it
        # read the answer, every run (else the answer could arrive first, and nobody left).
        leaving.wait(TIMEOUT_S)
        with pytest.raises(asyncio.CancelledError):
            await adding
        left.set()
        await until(loop, pool_is_free(loop))
        assert await loop.call(lambda: "left" not in loop.streams)
        assert (await loop.call(loop.snapshot)).finished == {("a", "abort"): 1}  # not "length"

    asyncio.run(main())
    assert loop.alive


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_closed_event_loop_ends_its_own_streams_not_the_engine(make_loop):
    """A caller's event loop closes while its request still runs (asyncio.run returned)."""
    loop = make_loop().start()

    async def leave() -> None:
        await next_output(await loop.add(prompt(1), LONG, "a", "orphan"))

    asyncio.run(leave())
    for _ in range(TIMEOUT_S * 100):  # until the orphan is gone, one way or the other
        if not loop.thread.is_alive() or not loop.engine.requests:
            break
        time.sleep(0.01)
    assert loop.alive, f"the engine loop died: {loop.error!r}"

    async def again() -> int:
        return len(await collect(await loop.add(prompt(2), GREEDY, "b", "next")))

    assert asyncio.run(again()) == 8


def test_a_stopped_loop_refuses_commands(make_loop):
    loop = make_loop().start()
    loop.stop()
    assert not loop.thread.is_alive() and loop.error is None

    async def main() -> None:
        with pytest.raises(RuntimeError, match="not running"):
            await asyncio.wait_for(loop.call(lambda: 1), TIMEOUT_S)

    asyncio.run(main())
