"""Assignment a3: admission and one continuous-batching step (Lesson 3).

Algorithm 2's admission round (`admission_round`) is graded on a scheduler alone, with a
`place` that records each request it is offered; the rest through the engine: with the course
harness's stand-in runner (one token per running request per step) for admission, head-of-line
blocking and freeing; with a small real model for the tokens (continuous batching gives each
request the tokens of generating it alone). A step under blocks on demand (Lesson 10) and
make_room's displacement loop are a4b's (`test_a4b_memory.py`)."""

from __future__ import annotations

import pytest
import torch

from minivtc.course.graded.driver import UnitRunner
from minivtc.course.graded.vtc_moves import request
from minivtc.engine.admission import FullReservation
from minivtc.engine.engine import Engine
from minivtc.engine.engine_config import EngineConfig
from minivtc.engine.factory import build_engine
from minivtc.engine.generate import generate_plain
from minivtc.engine.kv_pool import BlockAllocator
from minivtc.fairness.cost import W_P, W_Q
from minivtc.fairness.scheduler import FCFS, admission_round
from minivtc.fairness.vtc import VTC
from minivtc.model.config import LlamaConfig
from minivtc.model.llama import Llama
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request, Status

__all__ = ["unit_engine"]


class Place:
    """`place` for an admission round: room for `room` requests; records each offer, and
    refuses to be offered the same request twice in one round (a round that does not stop at a
    misfit would offer it forever)."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.offered: list[Request] = []
        self.placed: list[Request] = []

    def __call__(self, r: Request) -> bool:
        assert r not in self.offered, (
            f"{r.request_id} was offered to place twice in one round: the round must stop at "
            "the first request that does not fit (return it), never try again or skip it"
        )
        self.offered.append(r)
        if len(self.placed) == self.room:
            return False
        self.placed.append(r)
        return True


def waiting_vtc(clients: str) -> VTC:
    vtc = VTC()
    for i, client in enumerate(clients):
        vtc.add(request(client, 10, max_tokens=4, name=f"{client}{i}"), 0.0)
    return vtc


def test_the_admission_round_dispatches_what_fits_and_stops_at_the_first_misfit():
    """admission_round: peek, place, dispatch, until place says no; the misfit is returned,
    still waiting and uncharged, and nothing behind it is offered."""
    vtc, place, seen = waiting_vtc("AAB"), Place(room=2), []

    def dispatched(request: Request) -> None:  # (a function of the tests': the sandbox calls it)
        seen.append(request)

    stopped = admission_round(vtc, place, dispatched)
    ids = [r.request_id for r in place.offered]
    assert ids == ["A0", "B2", "A1"], (
        f"offered {ids} to place, not A0, B2, A1: each peeked request is offered once, and "
        "the round stops at the first that does not fit"
    )
    assert stopped is place.offered[-1] and [r.request_id for r in vtc.waiting()] == ["A1"], (
        f"the round returned {stopped and stopped.request_id} and left "
        f"{[r.request_id for r in vtc.waiting()]} waiting: it returns the request it stopped at, "
        "which stays in Q (dispatch only what place admitted)"
    )
    assert vtc.counters == {"A": 10 * W_P, "B": 10 * W_P}, (
        f"counters {vtc.counters}: each admitted prompt is charged once, the misfit's not at "
        "all (dispatch only after place says yes)"
    )
    assert seen == place.placed, (
        f"`dispatched` heard {[r.request_id for r in seen]}, not each dispatched request in "
        "order (a check's bookkeeping: call it after each dispatch)"
    )


def test_the_admission_round_charges_each_prompt_before_the_next_peek():
    """Each dispatch comes before the next peek, so VTC alternates A and B; with room for all,
    the round empties Q and returns None."""
    vtc, place = waiting_vtc("AAABBB"), Place(room=6)
    stopped = admission_round(vtc, place)
    order = "".join(r.client_id for r in place.offered)
    assert order == "ABABAB" and stopped is None and vtc.peek() is None, (
        f"admitted {order} and returned {stopped}, not ABABAB and None: dispatch (the prompt's "
        "charge) before the next peek, and a round with room for all empties Q"
    )


def test_full_reservation_reserves_prompt_plus_max_tokens_or_nothing():
    """reserve takes blocks for prompt + max_tokens, or nothing when they do not fit."""
    allocator = BlockAllocator(10, 4)  # 40 tokens
    full = FullReservation(allocator)
    a = Request("a", "c", [1] * 10, SamplingParams(max_tokens=14), 0.0)  # 24 tokens: 6 blocks
    b = Request("b", "c", [1] * 10, SamplingParams(max_tokens=10), 0.0)  # 20 tokens: 5 blocks
    assert full.reserve(a) and allocator.num_used_blocks == 6, (
        f"reserve of 10 prompt + 14 max_tokens in blocks of 4: {allocator.num_used_blocks} "
        "blocks used, not 6 = ceil(24 / 4), or it said no (FullReservation.reserve)"
    )
    assert not full.reserve(b) and allocator.num_used_blocks == 6, (
        f"a second request of 20 tokens, 4 blocks left: reserve said yes or took blocks "
        f"({allocator.num_used_blocks} used, not 6): a reservation that does not fit takes "
        "nothing and returns False"
    )
    allocator.check_invariants()


def unit_engine(kv_tokens: int, scheduler=None, block_size: int = 1, **options) -> Engine:
    clock = [0.0]
    return Engine(
        UnitRunner(clock),
        BlockAllocator(kv_tokens // block_size, block_size),
        scheduler or FCFS(),
        10**6,
        eos_id=-1,
        clock=lambda: clock[0],
        config=EngineConfig(check_invariants=True, **options),
    )


def test_each_step_charges_its_tokens_to_the_clients():
    """A step charges the tokens it made to their clients (the scheduler's on_decode)."""
    engine = unit_engine(kv_tokens=40, scheduler=VTC())
    engine.add_request([5] * 4, SamplingParams(max_tokens=3, ignore_eos=True), client_id="a")
    engine.step()
    engine.step()
    counter = engine.scheduler.counters["a"]
    assert counter == W_P * 4 + W_Q * 2, (
        f"after two steps of a request with a 4-token prompt, client a's counter is {counter}, "
        f"not {W_P * 4 + W_Q * 2}: each step's tokens are charged (scheduler.on_decode)"
    )


class NoEmptyBatch(UnitRunner):
    def run(self, requests, allocator):
        assert requests, "a step with nothing to run must not call the runner (a forward pass)"
        return super().run(requests, allocator)


class Broken(FCFS):
    def check_invariants(self) -> None:
        raise AssertionError("the scheduler's invariants were checked")


def test_a_step_ends_by_checking_the_invariants():
    """With check_invariants on, a step ends by checking them (the pool's, the scheduler's)."""
    engine = unit_engine(kv_tokens=40, scheduler=Broken())
    engine.add_request([5] * 4, SamplingParams(max_tokens=3, ignore_eos=True))
    with pytest.raises(AssertionError, match="invariants were checked"):
        engine.step()


def test_one_step_admits_runs_appends_and_retires():
    """One step admits, runs, appends a token to each running request and retires the finished
    ones."""
    engine = unit_engine(kv_tokens=30)
    a = engine.add_request([5] * 4, SamplingParams(max_tokens=2, ignore_eos=True))
    b = engine.add_request([5] * 4, SamplingParams(max_tokens=3, ignore_eos=True))
    ran = engine.step()  # both admitted (6 + 7 <= 30), both prefill and get a token
    assert ran == [a, b] and [len(r.output_ids) for r in ran] == [1, 1], (
        f"the first step returned {ran} with {[len(r.output_ids) for r in ran]} tokens, not "
        "both requests (admitted: 6 + 7 tokens fit in 30) with one token each"
    )
    assert a.num_computed == 4 and a.status is Status.RUNNING, (
        f"after its prefill, a has num_computed {a.num_computed} (not its 4 prompt tokens) "
        f"and status {a.status} (not RUNNING)"
    )
    engine.step()  # a's second token: a is done and gives its blocks back
    assert a.finish_reason == "length" and a not in engine.running, (
        f"a has its 2 tokens: finish_reason {a.finish_reason!r}, still running: "
        f"{a in engine.running} (Engine.step appends with the stop rules, then retires)"
    )
    assert engine.allocator.num_used_blocks == 7, (
        f"a retired: {engine.allocator.num_used_blocks} blocks used, not b's 7 (a retired "
        "request's blocks go back)"
    )
    engine.step()
    assert b.finish_reason == "length", f"b has its 3 tokens: finish_reason {b.finish_reason!r}"
    engine.runner = NoEmptyBatch(engine.runner.clock)
    assert engine.step() == [], "nothing runs, and a step with no batch must not run the model"
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks, (
        f"every request finished but {engine.allocator.num_used_blocks} blocks are still held "
        "(Engine.step retires each finished request: its blocks go back)"
    )


def test_a_request_that_does_not_fit_waits_and_blocks_those_behind_it():
    """Head of line: FCFS stops at the first misfit, even if a later request would fit."""
    engine = unit_engine(kv_tokens=20)
    a = engine.add_request([5] * 4, SamplingParams(max_tokens=8, ignore_eos=True))  # 12
    big = engine.add_request([5] * 4, SamplingParams(max_tokens=6, ignore_eos=True))  # 10
    small = engine.add_request([5] * 1, SamplingParams(max_tokens=1, ignore_eos=True))  # 2
    engine.step()
    assert engine.running == [a] and big.status is small.status is Status.WAITING, (
        f"running {engine.running}: big (10 tokens) does not fit beside a (12 of 20), and "
        "small, behind it, must wait too (Algorithm 2 never skips the head of the line)"
    )
    while a.finish_reason is None:
        engine.step()
    engine.step()  # a's blocks are free: big and small both fit now
    assert big.status is Status.RUNNING and small.output_ids, (
        f"a finished and freed its blocks: big is {big.status}, small has "
        f"{len(small.output_ids)} tokens; both fit now and must be admitted"
    )


def test_the_batch_holds_at_most_max_running_and_a_request_over_it_reserves_nothing():
    """A step's admission: a request beyond the batch's max_running waits, holding no blocks, though
    its blocks would fit; it is admitted when a place in the batch frees."""
    engine = unit_engine(kv_tokens=100, max_running=2)
    a, b, c = (
        engine.add_request([5] * 4, SamplingParams(max_tokens=n, ignore_eos=True))
        for n in (1, 3, 3)
    )
    engine.step()  # a and b admitted; a has its one token and retires
    used = engine.allocator.num_used_blocks
    assert a.finish_reason == "length" and engine.running == [b], (
        f"max_running 2: a (1 token) finished, running {engine.running}: not b alone (c must "
        "wait, though its 7 tokens fit in the pool: Engine.step admits through Engine.schedule)"
    )
    assert c.status is Status.WAITING and used == 7, (
        f"c waited for a place in the batch: it must hold no blocks, but {used} are used, not "
        "b's 7 (a step reserves only what it admits)"
    )
    engine.step()  # a's place is free: c takes it
    assert c.status is Status.RUNNING, f"a left the batch: c is {c.status}, not admitted"


def test_continuous_batching_gives_each_request_its_tokens_alone():
    """Continuous batching gives each request the tokens it would get alone."""
    torch.manual_seed(0)
    model = Llama(
        LlamaConfig(
            vocab_size=256,
            dim=32,
            n_layers=2,
            n_heads=4,
            n_kv_heads=2,
            ffn_dim=48,
            max_positions=128,
        )
    ).eval()
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine = build_engine(model, None, kv_tokens=200, block_size=4, check_invariants=True)
    prompts = [[3, 9, 27], [50, 60], [7, 8, 9, 10, 11], [100], [42, 43]]
    requests = [engine.add_request(p, params) for p in prompts[:2]]
    for p in prompts[2:]:  # arrivals between steps join the running batch
        engine.step()
        requests.append(engine.add_request(p, params))
    while engine.has_unfinished():
        engine.step()
    for p, r in zip(prompts, requests, strict=True):
        alone = list(generate_plain(model, p, params))
        assert r.output_ids == alone, (
            f"prompt {p} in a continuous batch gave {r.output_ids}, alone {alone} (Engine.step:"
            " each request's own positions and blocks, its tokens appended in batch order)"
        )
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks, (
        f"every request finished but {engine.allocator.num_used_blocks} blocks are still held "
        "(Engine.step retires each finished request: its blocks go back)"
    )
