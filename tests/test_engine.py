"""The engine: continuous batching gives the tokens of one-at-a-time generation, leaks no block."""

from __future__ import annotations

import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minivtc.engine.engine import RequestRejected
from minivtc.engine.engine_config import EngineConfig
from minivtc.engine.factory import build_engine
from minivtc.engine.generate import generate_plain
from minivtc.engine.sampler import SamplingParams
from minivtc.model.config import LlamaConfig
from minivtc.model.llama import Llama
from minivtc.model.tokenizer import Tokenizer
from minivtc.model.weights import BUNDLED_WEIGHTS
from minivtc.requests.request import Status
from tests.conftest import TINY_GQA

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny() -> Llama:
    torch.manual_seed(0)
    return Llama(TINY_GQA).eval()


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(BUNDLED_WEIGHTS / "tokenizer.model")


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 40, (n,), generator=gen).tolist()
    return [torch.randint(3, 4096, (n,), generator=gen).tolist() for n in lengths]


def run_to_end(engine):
    while engine.has_unfinished():
        engine.step()


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_staggered_batching_equals_one_at_a_time(tiny, block_size):
    engine = build_engine(tiny, None, kv_tokens=600, block_size=block_size, check_invariants=True)
    ps = prompts(6)
    reqs = [engine.add_request(p, GREEDY) for p in ps[:2]]
    for new in (ps[2:4], [], ps[4:5], ps[5:]):  # arrivals between steps
        engine.step()
        reqs += [engine.add_request(p, GREEDY) for p in new]
    run_to_end(engine)
    for p, r in zip(ps, reqs, strict=True):
        assert r.output_ids == list(generate_plain(tiny, p, GREEDY)), r
        assert r.finish_reason == "length" and r.status is Status.FINISHED
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks


def test_small_pool_queues_and_still_matches(tiny):
    """A pool too small for all five at once: some wait, and the tokens do not change."""
    engine = build_engine(tiny, None, kv_tokens=2 * 52, block_size=4, check_invariants=True)
    ps = [p[:40] for p in prompts(5, seed=1)]
    reqs = [engine.add_request(p, GREEDY) for p in ps]
    most_running = 0
    while engine.has_unfinished():
        engine.step()
        most_running = max(most_running, len(engine.running))
    assert 1 < most_running < len(ps)
    for p, r in zip(ps, reqs, strict=True):
        assert r.output_ids == list(generate_plain(tiny, p, GREEDY))


def test_too_large_requests_are_rejected_and_nothing_is_disturbed(tiny):
    engine = build_engine(tiny, None, kv_tokens=64, block_size=16, check_invariants=True)
    ok = engine.add_request([5, 6, 7], GREEDY)
    engine.step()
    with pytest.raises(RequestRejected, match="can never fit in the KV pool of 64 tokens"):
        engine.add_request(list(range(3, 60)), GREEDY)
    with pytest.raises(RequestRejected, match="exceeds the model's context of 256"):
        engine.add_request([5], SamplingParams(max_tokens=300))
    with pytest.raises(RequestRejected, match="prompt is empty"):
        engine.add_request([], GREEDY)
    with pytest.raises(RequestRejected, match="already in use"):
        engine.add_request([5], GREEDY, request_id=ok.request_id)
    run_to_end(engine)
    assert ok.output_ids == list(generate_plain(tiny, [5, 6, 7], GREEDY))
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks


def test_abort_frees_blocks_at_once(tiny):
    engine = build_engine(tiny, None, kv_tokens=64, block_size=4, check_invariants=True)
    a = engine.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=40))
    b = engine.add_request([8, 9], GREEDY)  # waits: a holds 44 of 64 tokens, b needs 14 ... fits
    c = engine.add_request([8, 9, 10], SamplingParams(temperature=0, max_tokens=40))  # must wait
    engine.step()
    engine.step()
    assert a.status is Status.RUNNING and c.status is Status.WAITING
    used = engine.allocator.num_used_blocks
    engine.abort(a.request_id)
    assert engine.allocator.num_used_blocks == used - engine.allocator.blocks_needed(43)
    assert a.status is Status.ABORTED and a.finish_reason == "abort"
    engine.abort(c.request_id)  # a waiting request leaves the queue
    assert engine.scheduler.num_waiting == 0
    engine.abort(c.request_id)  # idempotent
    run_to_end(engine)
    assert b.output_ids == list(generate_plain(tiny, [8, 9], GREEDY))
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks


class ScriptedRunner:
    """Returns scripted tokens per request (no model): for lifecycle tests."""

    def __init__(self, script):
        self.script = script

    def run(self, requests, allocator):
        return [self.script(r) for r in requests]

    def release(self, request):
        pass


def memory(reservation: str, **on_demand) -> dict:
    """Memory options for drawn combinations: blocks on demand's own only where they mean
    something (`EngineConfig` refuses a victim with a reservation)."""
    return {"reservation": reservation, **(on_demand if reservation == "none" else {})}


def scripted_engine(script, tokenizer=None, clock=None, **kw):
    from minivtc.engine.engine import Engine
    from minivtc.engine.kv_pool import BlockAllocator
    from minivtc.fairness.scheduler import FCFS

    return Engine(
        ScriptedRunner(script),
        BlockAllocator(100, 4),
        FCFS(),
        max_positions=400,
        eos_id=2,
        tokenizer=tokenizer,
        clock=clock or time.monotonic,
        config=EngineConfig(check_invariants=True, **kw),
    )


def test_eos_finishes_unless_ignored():
    engine = scripted_engine(lambda r: 2 if r.num_output == 3 else 7)
    stop = engine.add_request([5], SamplingParams(max_tokens=10))
    go_on = engine.add_request([5], SamplingParams(max_tokens=10, ignore_eos=True))
    run_to_end(engine)
    assert stop.output_ids == [7, 7, 7, 2] and stop.finish_reason == "eos"
    assert go_on.num_output == 10 and go_on.finish_reason == "length"


def test_stop_sequence_cuts_text_and_streams_nothing_past_it(tokenizer):
    ids = tokenizer.encode("alpha beta STOP gamma delta", bos=False)
    engine = scripted_engine(lambda r: ids[r.num_output], tokenizer=tokenizer)
    r = engine.add_request("Say:", SamplingParams(max_tokens=len(ids), stop=("STOP",)))
    streamed = []
    while engine.has_unfinished():
        streamed += [engine.output(r).text_delta for r in engine.step()]
    assert r.finish_reason == "stop"
    assert r.text == "".join(streamed) == " alpha beta "


def test_timestamps_and_client_token_counts():
    t = [0.0]

    def clock():
        t[0] += 1.0
        return t[0]

    engine = scripted_engine(lambda r: 7, clock=clock)
    a = engine.add_request([5, 6, 7], SamplingParams(max_tokens=4), client_id="alice")
    b = engine.add_request([5], SamplingParams(max_tokens=2), client_id="bob")
    run_to_end(engine)
    for r in (a, b):
        assert r.arrival_time < r.admitted_time < r.first_token_time < r.finish_time
    assert (engine.client_tokens["alice"].num_input, engine.client_tokens["alice"].num_output) == (
        3,
        4,
    )
    assert (engine.client_tokens["bob"].num_input, engine.client_tokens["bob"].num_output) == (1, 2)


def test_llm_generate_offline_api():
    from minivtc.offline.llm import LLM

    llm = LLM(kv_tokens=2000)
    outs = llm.generate(["The list", "A module is"], SamplingParams(temperature=0, max_tokens=8))
    assert [len(o.token_ids) for o in outs] == [8, 8]
    # The text keeps the space that separates it from the prompt, as vLLM's does.
    for prompt, out in zip(["The list", "A module is"], outs, strict=True):
        assert llm.tokenizer.decode(out.prompt_token_ids + out.token_ids) == prompt + out.text
    with pytest.raises(RequestRejected):
        llm.generate(["ok", "x " * 3000], SamplingParams(max_tokens=8))
    assert not llm.engine.has_unfinished()  # the good prompt was withdrawn too


@settings(max_examples=25, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(1, 30), st.integers(1, 20)),
            st.tuples(st.just("step"), st.just(0), st.just(0)),
            st.tuples(st.just("abort"), st.integers(0, 40), st.just(0)),
        ),
        max_size=40,
    ),
    kv_tokens=st.integers(32, 200),
    block_size=st.sampled_from([1, 3, 16]),
    reservation=st.sampled_from(["full", "peak", "none"]),
    victim=st.sampled_from(["latest", "fair"]),
    preemption=st.sampled_from(["recompute", "swap"]),
    prefix_caching=st.booleans(),
)
def test_random_add_step_abort_keeps_invariants(
    ops, kv_tokens, block_size, reservation, victim, preemption, prefix_caching
):
    torch.manual_seed(0)
    model = Llama(
        LlamaConfig(
            vocab_size=64, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=16, max_positions=64
        )
    )
    engine = build_engine(
        model,
        None,
        "vtc",
        kv_tokens=kv_tokens,
        block_size=block_size,
        max_running=4,
        check_invariants=True,
        **memory(reservation, victim=victim, preemption=preemption),
        prefix_caching=prefix_caching,
    )
    added = []
    for op, a, b in ops:
        if op == "add":
            try:
                added.append(
                    engine.add_request(list(range(1, a + 1)), SamplingParams(max_tokens=b))
                )
            except RequestRejected:
                assert a + b > min(64, engine.allocator.num_tokens)
        elif op == "step":
            engine.step()
        elif added:
            engine.abort(added[a % len(added)].request_id)
        engine.check()
    run_to_end(engine)
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks
    assert all(r.is_finished for r in added) and not engine.runner.swapped


@pytest.mark.slow
@settings(max_examples=80, deadline=None)
@given(
    specs=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 30), st.integers(1, 20), st.integers(0, 3)),
        min_size=1,
        max_size=12,
    ),
    kv_tokens=st.integers(32, 120),
    block_size=st.sampled_from([1, 4]),
    victim=st.sampled_from(["latest", "fair"]),
    preemption=st.sampled_from(["recompute", "swap"]),
    swap_tokens=st.sampled_from([None, 0, 30]),
    prefix_caching=st.booleans(),
)
def test_recomputed_tokens_are_the_positions_a_request_computed_twice(
    specs, kv_tokens, block_size, victim, preemption, swap_tokens, prefix_caching
):
    """Blocks on demand; prompts of one family share prefixes. The test records the positions
    each request has held (computed, or found cached: those before its num_computed) whenever
    it computes or is preempted: those it computes again, after a preemption threw them away,
    are exactly `recomputed_tokens` (what the cache still held, or the host gave back, is not
    computed again, and not counted)."""
    torch.manual_seed(0)
    model = Llama(
        LlamaConfig(
            vocab_size=64, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=16, max_positions=64
        )
    )
    engine = build_engine(
        model,
        None,
        "vtc",
        kv_tokens=kv_tokens,
        block_size=block_size,
        check_invariants=True,
        reservation="none",
        victim=victim,
        preemption=preemption,
        swap_tokens=swap_tokens if preemption == "swap" else None,
        prefix_caching=prefix_caching,
    )
    seen, twice, run, preempt = {}, [0], engine.runner.run, engine.preempt

    def recording(requests, allocator):
        for r in requests:
            held = seen.setdefault(r.request_id, set())
            held.update(range(r.num_computed))
            twice[0] += len(held & set(range(r.num_computed, r.num_tokens)))
            held.update(range(r.num_computed, r.num_tokens))
        return run(requests, allocator)

    def preempting(request):  # what it holds now may have been found cached since it last ran
        seen.setdefault(request.request_id, set()).update(range(request.num_computed))
        preempt(request)

    engine.runner.run, engine.preempt = recording, preempting
    for family, prompt, max_tokens, wait in specs:
        try:
            engine.add_request(
                [(7 * family + j) % 63 + 1 for j in range(prompt)],
                SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            )
        except RequestRejected:  # longer than the pool
            assert prompt + max_tokens > kv_tokens // block_size * block_size
        for _ in range(wait):
            engine.step()
    run_to_end(engine)
    assert engine.preemption.recomputed_tokens == twice[0]
    assert engine.preemption.host_tokens == 0 and not engine.runner.swapped


def test_peak_reservation_admits_more_and_gives_the_same_tokens(tiny):
    """The artifact's check: a short request can join while a long one holds most of the pool,
    because the short one finishes before the long one reaches its peak."""
    long = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    short = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    concurrency = {}
    for reservation in ("full", "peak"):
        engine = build_engine(
            tiny, None, kv_tokens=80, block_size=1, check_invariants=True, reservation=reservation
        )
        a = engine.add_request([5] * 10, long)
        b = engine.add_request([6] * 10, short)
        engine.step()
        concurrency[reservation] = len(engine.running)
        run_to_end(engine)
        assert a.output_ids == list(generate_plain(tiny, [5] * 10, long))
        assert b.output_ids == list(generate_plain(tiny, [6] * 10, short))
    assert concurrency == {"full": 1, "peak": 2}


@pytest.mark.parametrize("pool", ["reserved", "preempting", "prefix-cached"])
def test_batched_engine_matches_transformers_greedy_on_the_bundled_model(bundled, pool):
    """Staggered continuous batching == `transformers` generating each prompt alone (32 tokens),
    also with a pool so small that requests are preempted and recomputed on the way, and with
    a prefix cache (every prompt opens with the same sentence: later ones skip its blocks)."""
    transformers = pytest.importorskip("transformers")
    from minivtc.model.weights import bundled_weights_dir

    model, tok = bundled
    hf = transformers.LlamaForCausalLM.from_pretrained(bundled_weights_dir(), dtype=torch.float32)
    texts = ["The garbage collector", "A list is a", "To open a file, call", "Exceptions are"]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    options = {"kv_tokens": 1000}
    if pool == "preempting":
        options = {"kv_tokens": 96, "reservation": "none"}
    if pool == "prefix-cached":
        options = {"kv_tokens": 1000, "prefix_caching": True}
        texts = ["In Python, as the tutorial explains in its first chapter, " + t for t in texts]
    engine = build_engine(model, tok, block_size=16, check_invariants=True, **options)
    reqs = [engine.add_request(t, params) for t in texts[:2]]
    engine.step()
    reqs += [engine.add_request(t, params) for t in texts[2:]]  # join mid-flight: mixed steps
    run_to_end(engine)
    for r in reqs:
        ids = torch.tensor([r.prompt_ids])
        with torch.no_grad():
            out = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=32,
                min_new_tokens=32,
                do_sample=False,
                pad_token_id=0,
            )
        assert r.output_ids == out[0, ids.shape[1] :].tolist(), r
    assert (engine.num_preemptions > 0) == (pool == "preempting")
    assert (engine.num_cached_tokens > 0) == (pool == "prefix-cached")


@pytest.mark.parametrize(
    ("victim", "preemption", "prefix_caching", "swap_tokens"),
    [
        ("latest", "recompute", False, None),
        ("fair", "recompute", False, None),
        ("fair", "swap", False, 10**6),
        ("fair", "swap", True, 10**6),
        ("fair", "swap", False, 40),
    ],
)
def test_preempted_requests_give_the_tokens_of_an_unpreempted_run(
    tiny, victim, preemption, prefix_caching, swap_tokens
):
    """Blocks on demand in a pool too small for everyone: requests are preempted (their blocks
    freed) and later prefilled again with the tokens they had, or, swapped, get their keys and
    values back from host memory; each still gets exactly the greedy tokens of generating it
    alone, and its prompt is charged once. With host memory for 40 tokens a preemption that
    would need more recomputes (the engine asserts the host holds at most 40 after every
    step), and the tokens are the same."""
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    engine = build_engine(
        tiny,
        None,
        "vtc",
        kv_tokens=64,
        block_size=4,
        check_invariants=True,
        check_fairness=victim == "fair",
        reservation="none",
        victim=victim,
        preemption=preemption,
        swap_tokens=swap_tokens,
        prefix_caching=prefix_caching,
    )
    ps = [prompts(6, seed=3)[i][:12] for i in range(6)]
    reqs = [engine.add_request(p, params, client_id=f"c{i % 3}") for i, p in enumerate(ps)]
    run_to_end(engine)
    swap, host_full = preemption == "swap", swap_tokens == 40
    assert engine.num_preemptions > 0 and (engine.preemption.swapped_tokens > 0) == swap
    assert (engine.preemption.recomputed_tokens > 0) == (
        not swap or host_full
    )  # swap: only when full
    assert not engine.runner.swapped and engine.preemption.host_tokens == 0  # all back, or dropped
    for p, r in zip(ps, reqs, strict=True):
        assert r.output_ids == list(generate_plain(tiny, p, params)), r
    assert sum(t.num_input for t in engine.client_tokens.values()) == sum(map(len, ps))
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks


def test_aborting_a_swapped_out_request_frees_its_host_copy(tiny):
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    engine = build_engine(
        tiny,
        None,
        "vtc",
        kv_tokens=64,
        block_size=4,
        check_invariants=True,
        reservation="none",
        preemption="swap",
    )
    engine.add_request([5] * 8, params, client_id="a")
    b = engine.add_request([6] * 8, params, client_id="b")
    while b.num_preemptions == 0:
        engine.step()
    assert b.num_computed > 0 and b.request_id in engine.runner.swapped  # on the host
    engine.abort(b.request_id)
    assert not engine.runner.swapped
    run_to_end(engine)
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks


def test_preemption_must_be_recompute_or_swap(tiny):
    with pytest.raises(ValueError, match="preemption must be"):
        build_engine(tiny, None, kv_tokens=64, reservation="none", preemption="drop")


def test_aborting_a_preempted_request_frees_everything(tiny):
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    engine = build_engine(
        tiny, None, "vtc", kv_tokens=64, block_size=4, check_invariants=True, reservation="none"
    )
    a = engine.add_request([5] * 8, params, client_id="a")
    b = engine.add_request([6] * 8, params, client_id="b")
    while b.num_preemptions == 0:  # b, admitted last, is vLLM's victim
        engine.step()
    assert b.status is Status.WAITING and b.request_id not in engine.allocator.block_tables
    engine.abort(b.request_id)
    assert b.finish_reason == "abort" and not list(engine.scheduler.waiting())
    run_to_end(engine)
    assert a.finish_reason == "length"
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks and not engine.requests


def test_the_fair_victim_is_the_youngest_request_of_the_highest_counter_client(tiny):
    """Two clients share the pool; "b" has received more (a long prompt), so when blocks run
    out its youngest request is preempted, not the most recently admitted one ("a"'s)."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for victim, loser in (("fair", "b-young"), ("latest", "a")):
        engine = build_engine(
            tiny,
            None,
            "vtc",
            kv_tokens=64,
            block_size=4,
            reservation="none",
            victim=victim,
            check_invariants=True,
        )
        engine.add_request([5] * 16, params, client_id="b", request_id="b-old")
        engine.add_request([6] * 8, params, client_id="b", request_id="b-young")
        engine.step()
        engine.add_request([7] * 4, params, client_id="a", request_id="a")  # admitted last
        while engine.num_preemptions == 0:
            engine.step()
        preempted = [r.request_id for r in engine.requests.values() if r.num_preemptions]
        assert preempted == [loser], (victim, preempted)


def test_admission_cadence_of_the_artifact():
    """admit_every=3: after a successful admission, the next try is 3 steps later; while a
    try admits nothing, it is retried every step (the official artifact admits every 10 steps)."""
    engine = scripted_engine(lambda r: 7, admit_every=3)
    first = engine.add_request([5], SamplingParams(max_tokens=20))
    engine.step()  # admits `first`
    late = engine.add_request([5], SamplingParams(max_tokens=2))
    engine.step()
    engine.step()
    assert late.status is Status.WAITING  # steps 2 and 3: no admission
    engine.step()
    assert late.status is Status.RUNNING and first.status is Status.RUNNING  # step 4: admitted


# --- fault isolation: one request's failure is that request's alone ---------------------------


class FailingDetokenizer:
    """Stands in for one request's detokenizer: its third token raises (a bug in its text)."""

    def __init__(self) -> None:
        self.calls = 0

    def add(self, token: int) -> str:
        self.calls += 1
        if self.calls == 3:
            raise UnicodeError("injected: this request's text cannot be decoded")
        return "x"

    def flush(self) -> str:
        return ""


@pytest.mark.parametrize("fault", ["detokenize", "seed", "sample"])
def test_a_fault_in_one_request_ends_it_alone(tiny, tokenizer, fault):
    """A fault injected into one request of a running batch ends that request with reason
    "error" and frees its blocks; the others get exactly the tokens of a fault-free run."""
    ps = prompts(3, seed=5)
    sampled = SamplingParams(temperature=0.8, max_tokens=12, ignore_eos=True, seed=7)
    clean = build_engine(tiny, tokenizer, kv_tokens=600, check_invariants=True)
    want = [clean.add_request(p, GREEDY) for p in ps]
    run_to_end(clean)
    engine = build_engine(tiny, tokenizer, kv_tokens=600, check_invariants=True)
    reqs = [engine.add_request(p, GREEDY if i != 1 else sampled) for i, p in enumerate(ps)]
    engine.step()  # all three are running
    victim = reqs[1]
    if fault == "detokenize":
        engine.texts.detokenizers[victim.request_id] = FailingDetokenizer()
    elif fault == "seed":  # what an unchecked seed did: manual_seed raises on the engine thread
        engine.runner.generators.pop(victim.request_id)
        object.__setattr__(victim.params, "seed", 2**64)
    else:  # sampling itself fails for this row
        engine.runner.generators[victim.request_id] = "not a generator"
    outputs = []
    while engine.has_unfinished():
        outputs += [engine.output(r) for r in engine.step()]
    assert victim.finish_reason == "error" and victim.error, victim
    errors = [o for o in outputs if o.request_id == victim.request_id and o.finish_reason]
    assert len(errors) == 1 and errors[0].finish_reason == "error" and errors[0].error
    for got, expect in zip([reqs[0], reqs[2]], [want[0], want[2]], strict=True):
        assert got.output_ids == expect.output_ids and got.finish_reason == "length"
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks
    assert not engine.requests and victim.request_id not in engine.runner.generators


def test_seed_outside_64_bits_is_rejected_up_front():
    for seed in (-1, 2**63, 2**64):
        with pytest.raises(ValueError, match="seed"):
            SamplingParams(seed=seed)
    assert SamplingParams(seed=2**63 - 1).generator() is not None
