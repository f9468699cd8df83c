"""The prefix cache: the allocator's three block states and its hash table under random
operations; hits, eviction order; the engine with a cache gives the tokens it gives without
one; VTC charges a cached prompt token w_c and Lemma 4.3 still holds with the same U."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minivtc.course.graded.driver import UnitRunner
from minivtc.engine.engine import Engine
from minivtc.engine.factory import build_engine
from minivtc.engine.generate import generate_plain
from minivtc.engine.prefix_cache import PrefixCachingAllocator
from minivtc.engine.sampler import SamplingParams
from minivtc.fairness.scheduler import admission_round
from minivtc.fairness.vtc import VTC
from minivtc.requests.request import Request
from minivtc.sim.simulator import simulate
from minivtc.sim.workloads import TraceRequest
from tests.test_engine import memory, run_to_end, tiny  # noqa: F401 (a fixture)

PREFIXES = [[7] * 24, [8] * 40, [7] * 16 + [9] * 16]  # the first and third share a block (of 8)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "compute", "grow", "free"]),
            st.integers(0, 2),
            st.integers(1, 40),
        ),
        max_size=60,
    )
)
def test_random_operations_keep_the_allocators_invariants(ops):
    """Held (reference count = block tables listing it), evictable (cached, unheld, in the LRU)
    or free: each block is exactly one, after every operation; what can_allocate promises,
    allocate keeps; a cached prefix's blocks are shared, never copied."""
    alloc = PrefixCachingAllocator(num_blocks=20, block_size=8)
    live: dict[str, list[int]] = {}
    for i, (op, k, n) in enumerate(ops):
        if op == "add":
            prompt = PREFIXES[k] + [100 + i] * n
            if alloc.can_allocate_cached(len(prompt), prompt):
                alloc.allocate_cached(f"r{i}", len(prompt), prompt)
                live[f"r{i}"] = prompt
                hits = alloc.cached_tokens(f"r{i}")
                assert hits % 8 == 0 and hits < len(prompt)  # whole blocks, never the last token
        elif live and op == "compute":  # its prefill ran: name its full prompt blocks
            rid = sorted(live)[k % len(live)]
            alloc.cache_prompt(rid, live[rid], len(live[rid]))
        elif live and op == "grow":
            rid = sorted(live)[k % len(live)]
            wanted = len(alloc.block_tables[rid]) * 8 + 1
            if alloc.num_free_blocks:
                alloc.grow(rid, wanted)
        elif live:
            rid = sorted(live)[k % len(live)]
            alloc.free(rid)
            del live[rid]
        alloc.check_invariants()
    for rid in list(alloc.block_tables):
        alloc.free(rid)
    alloc.check_invariants()
    assert alloc.num_free_blocks == alloc.num_blocks  # cached blocks are free for the taking


def test_a_shared_prefix_is_found_block_by_block_and_never_its_last_token():
    alloc = PrefixCachingAllocator(num_blocks=10, block_size=4)
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    alloc.allocate_cached("a", len(a), a)
    assert alloc.cached_tokens("a") == 0  # a cold cache
    alloc.cache_prompt("a", a, len(a))  # blocks [1-4] and [5-8] are named
    b = [1, 2, 3, 4, 5, 6, 7, 8, 10, 11]
    table = alloc.allocate_cached("b", len(b), b)
    assert alloc.cached_tokens("b") == 8 and table[:2] == alloc.block_tables["a"][:2]
    c = [1, 2, 3, 4, 5, 6, 7, 8]  # equal to a's first two blocks, but its last token must run
    alloc.allocate_cached("c", len(c), c)
    assert alloc.cached_tokens("c") == 4
    d = [9, 2, 3, 4, 5, 6, 7, 8, 9]  # same second block, other first: the chain differs
    alloc.allocate_cached("d", len(d), d)
    assert alloc.cached_tokens("d") == 0
    alloc.check_invariants()


def test_unheld_cached_blocks_are_evicted_least_recently_used_first_and_only_when_needed():
    alloc = PrefixCachingAllocator(num_blocks=6, block_size=2)
    for rid, prompt in (("a", [1, 1, 1]), ("b", [2, 2, 2])):
        alloc.allocate_cached(rid, 3, prompt)
        alloc.cache_prompt(rid, prompt, 3)  # each names its first block
    alloc.free("a")  # a's cached block becomes evictable first, then b's
    alloc.free("b")
    assert alloc.num_free_blocks == 6 and len(alloc.evictable) == 2
    alloc.allocate_cached("c", 10, [3] * 10)  # 5 blocks: the 4 free ones, then the LRU cached one
    assert alloc.num_evicted == 1
    alloc.free("c")
    for rid, prompt, hit in (("a2", [1, 1, 1], 0), ("b2", [2, 2, 2], 2)):  # a's was evicted
        alloc.allocate_cached(rid, 3, prompt)
        assert alloc.cached_tokens(rid) == hit, rid
    alloc.check_invariants()


@pytest.mark.parametrize("reservation", ["full", "none"])
def test_greedy_tokens_with_a_prefix_cache_equal_those_without(tiny, reservation):  # noqa: F811
    """Requests sharing a 40-token prefix, staggered, in a pool small enough (with "none") to
    preempt: with the cache the later ones skip the shared prefill, and every request still
    gets exactly the greedy tokens of generating it alone."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    shared = torch.randint(3, 4096, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    ps = [shared + [10 + i] * (1 + i) for i in range(5)]
    engine = build_engine(
        tiny,
        None,
        "vtc",
        kv_tokens=160,
        block_size=8,
        check_invariants=True,
        reservation=reservation,
        prefix_caching=True,
    )
    reqs = [engine.add_request(ps[0], params)]
    engine.step()
    reqs += [engine.add_request(p, params) for p in ps[1:]]
    run_to_end(engine)
    for p, r in zip(ps, reqs, strict=True):
        assert r.output_ids == list(generate_plain(tiny, p, params)), r
    assert [r.num_cached for r in reqs] == [0, 40, 40, 40, 40]
    assert engine.num_cached_tokens == 160 and engine.allocator.num_used_blocks == 0


def test_vtc_charges_a_cached_prompt_token_w_c():
    for w_c, expected in (
        (None, 100 + 2 * 3),
        (1.0, 100 + 2 * 3),
        (0.5, 60 + 20 + 2 * 3),
        (0.0, 60 + 2 * 3),
    ):
        vtc = VTC(cached_weight=w_c)
        r = Request("r", "a", [1] * 100, SamplingParams(max_tokens=3), 0.0)
        r.num_cached = 40
        vtc.add(r, 0.0)
        admission_round(vtc, lambda req, vtc=vtc: True)
        for _ in range(3):
            r.output_ids.append(5)
            vtc.on_decode([r])
        assert vtc.counters["a"] == expected, w_c
    with pytest.raises(ValueError, match="cached_weight"):
        VTC(cached_weight=1.5)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 10**6), st.sampled_from([None, 1.0, 0.5, 0.0]), st.sampled_from(["full", "none"])
)
def test_lemma_4_3_holds_with_a_prefix_cache_for_every_cached_weight(seed, w_c, reservation):
    """A dispatch with cached tokens costs at most w_p L_input as before: the engine asserts
    the same U after every step (and with fair preemption, its bound), and the backlogged gap
    priced with w_c stays within the bound."""
    rng = random.Random(seed)
    trace = []
    for _ in range(60):
        client = rng.choice("ABC")
        prefix = rng.choice([None, "p", "q"]) if client != "C" else None
        k = 32 if prefix else 0
        trace.append(
            TraceRequest(
                client,
                rng.uniform(0, 20),
                k + rng.randint(1, 40),
                rng.randint(1, 30),
                None,
                prefix,
                k,
            )
        )
    r = simulate(
        trace,
        "vtc",
        "a10g-llama7b",
        kv_tokens=400,
        block_size=8,
        **memory(reservation, victim="fair"),
        check_fairness=True,
        watch_backlog=True,
        prefix_caching=True,
        cached_weight=w_c,
    )
    assert len(r.served) == len(trace) and r.backlogged_gap <= r.bound


def test_a_trace_with_prefixes_round_trips_and_the_simulator_reports_hits(tmp_path):
    from minivtc.sim.metrics import charged_cost, read_requests, service, write_requests
    from minivtc.sim.workloads import read_trace, write_trace

    trace = [TraceRequest("a", i / 10, 2048 + i, 8, None, "sys", 2000) for i in range(10)]
    trace.append(TraceRequest("b", 0.0, 20, 8))
    write_trace(tmp_path / "t.csv", trace)
    assert read_trace(tmp_path / "t.csv") == sorted(trace, key=lambda t: t.arrival_s)
    cold = simulate(trace, "vtc", kv_tokens=30000, block_size=16, reservation="full")
    warm = simulate(
        trace, "vtc", kv_tokens=30000, block_size=16, reservation="full", prefix_caching=True
    )
    assert cold.cached_tokens == 0 and warm.cached_tokens == 9 * 2000
    # each served record says how much of its prompt was cached, and requests.csv keeps it
    assert sorted(s.cached_tokens for s in warm.served) == [0, 0] + [2000] * 9
    write_requests(tmp_path / "requests.csv", warm.served)
    back = read_requests(tmp_path / "requests.csv")
    assert [s.cached_tokens for s in back] == [s.cached_tokens for s in warm.served]
    priced = service(warm.served, 0.0, 10**6, charged_cost(0.5))
    assert priced["a"] == service(warm.served, 0.0, 10**6)["a"] - 0.5 * 9 * 2000
    assert warm.prefix_hit_rate == pytest.approx(9 * 2000 / sum(t.input_tokens for t in trace))
    ttft = [sum(r.first_token_latency_s for r in run.served) for run in (cold, warm)]
    assert ttft[1] < ttft[0] / 2  # the prefill of 2,000 tokens skipped, nine times
    (tmp_path / "bad.csv").write_text(
        "client,arrival_s,input_tokens,output_tokens,prefix_id,prefix_tokens\na,0,10,5,p,11\n"
    )
    with pytest.raises(ValueError, match="prefix_tokens 11 is not within input_tokens 10"):
        read_trace(tmp_path / "bad.csv")


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_what_a_cache_keeps_is_neither_thrown_away_nor_copied_by_a_preemption(
    tiny,  # noqa: F811
    preemption,
):
    """b finds a's first two blocks cached. Preempted before its prefill, it threw nothing away
    and copies nothing. Preempted after, what lies past the cached prefix, in its own partial
    last block, is recomputed when it comes back; or, swapped, all its positions go to the host
    (the cache might evict its blocks meanwhile) and only that part comes back. Its tokens are
    those of generating it alone."""
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    engine = build_engine(
        tiny,
        None,
        "vtc",
        kv_tokens=64,
        block_size=4,
        check_invariants=True,
        reservation="none",
        preemption=preemption,
        prefix_caching=True,
    )
    a = list(range(10, 20))
    engine.add_request(a, params)
    run_to_end(engine)  # a's blocks of 10-13, 14-17 are named and kept (evictable)
    b = engine.add_request(a[:8] + [50, 51, 52], params)
    engine.schedule()  # admitted, not yet prefilled
    assert b.num_cached == 8 and b.num_computed == 8
    engine.preempt(b)
    engine.step()  # admitted again (8 cached) and prefilled
    assert (
        engine.preemption.recomputed_tokens
        == engine.preemption.swapped_tokens
        == engine.preemption.host_tokens
        == 0
    )
    engine.preempt(b)  # 11 positions computed: 0-7 in named blocks, 8-10 in its own
    engine.schedule()  # back, with 0-7 found cached
    if preemption == "swap":
        assert (
            engine.preemption.swapped_tokens == 11 + 3 and engine.preemption.recomputed_tokens == 0
        )
    else:
        assert engine.preemption.recomputed_tokens == 11 - 8
    run_to_end(engine)
    assert b.output_ids == list(generate_plain(tiny, b.prompt_ids, params))
    assert engine.preemption.host_tokens == 0 and not engine.runner.swapped


def test_an_engine_without_a_cache_reports_nothing_cached():
    clock = [0.0]
    from minivtc.engine.kv_pool import BlockAllocator

    engine = Engine(
        UnitRunner(clock), BlockAllocator(40, 4), VTC(), 100, eos_id=-1, clock=lambda: clock[0]
    )
    r = engine.add_request([5] * 9, SamplingParams(max_tokens=2, ignore_eos=True))
    run_to_end(engine)
    assert r.num_cached == 0 and engine.num_cached_tokens == 0 and engine.num_prompt_tokens == 9


# --- the real engine: LLM, the server ----------------------------------------------------------

SYSTEM = (
    "You are a careful Python tutor. Answer in one short paragraph, with an example "
    "where it helps, and never invent a function that does not exist. "
)


def test_llm_with_a_prefix_cache_gives_the_tokens_of_one_without(bundled):
    """`LLM(prefix_caching=True)`: the second prompt sharing the system text skips its cached
    blocks and still gets exactly the greedy tokens of an engine without a cache."""
    from minivtc.offline.llm import LLM

    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [SYSTEM + "What is a list?", SYSTEM + "What is a dict?"]
    cached = LLM(prefix_caching=True, policy="vtc")
    plain = LLM(policy="vtc")
    outs = [cached.generate(p, params)[0] for p in prompts]  # one after the other: a warm cache
    assert [o.outputs[0].token_ids for o in outs] == [
        o.outputs[0].token_ids for o in plain.generate(prompts, params)
    ]
    assert cached.engine.num_cached_tokens >= 16 and plain.engine.num_cached_tokens == 0
    assert outs[0].num_cached_tokens == 0 and outs[1].num_cached_tokens >= 16  # vLLM's field


def test_the_server_reports_cached_prompt_tokens_as_openai_does(bundled):
    import httpx
    import openai

    from minivtc.serving.hosting import BackgroundServer
    from minivtc.serving.server import make_app

    model, tokenizer = bundled
    engine = build_engine(
        model, tokenizer, "vtc", kv_tokens=1024, prefix_caching=True, check_invariants=True
    )
    with BackgroundServer(make_app(engine, tokenizer)) as url:
        api = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        usages = [
            api.completions.create(
                model="minivtc-tiny", prompt=SYSTEM + q, max_tokens=4, temperature=0
            ).usage
            for q in ("Lists?", "Dicts?")
        ]
        cached = [u.prompt_tokens_details.cached_tokens for u in usages]
        assert cached[0] == 0 and cached[1] >= 16 and cached[1] % 16 == 0
        text = httpx.get(url + "/metrics").text
        assert f"minivtc_prefix_cache_hit_tokens_total {float(cached[1])}" in text
        rate = cached[1] / sum(u.prompt_tokens for u in usages)
        assert f"minivtc_prefix_cache_hit_rate {rate}" in text


def test_a_salt_scopes_sharing():
    """Requests share cached blocks only under the same salt (the server salts with the API
    key's client: a tenant cannot learn from `cached_tokens` what another one sent)."""
    alloc = PrefixCachingAllocator(num_blocks=20, block_size=4)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    alloc.allocate_cached("a", 9, prompt, salt="alice")
    alloc.cache_prompt("a", prompt, 9, salt="alice")
    for rid, salt, hit in (("b", "bob", 0), ("c", None, 0), ("d", "alice", 8)):
        alloc.allocate_cached(rid, 9, prompt, salt)
        assert alloc.cached_tokens(rid) == hit, salt
    alloc.check_invariants()


def test_with_api_keys_tenants_do_not_share_the_cache(bundled, tmp_path):
    import json

    import openai

    from minivtc.serving.api_keys import Auth, read_keys
    from minivtc.serving.hosting import BackgroundServer
    from minivtc.serving.server import make_app

    model, tokenizer = bundled
    engine = build_engine(model, tokenizer, "vtc", kv_tokens=1024, prefix_caching=True)
    keys = {"sk-alice-0001": {"client": "alice"}, "sk-bob-00001": {"client": "bob"}}
    (tmp_path / "keys.json").write_text(json.dumps(keys))
    auth = Auth(read_keys(tmp_path / "keys.json"))
    with BackgroundServer(make_app(engine, tokenizer, auth=auth)) as url:

        def cached(key: str) -> int:
            api = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
            reply = api.completions.create(
                model="minivtc-tiny", prompt=SYSTEM + "Sets?", max_tokens=2, temperature=0
            )
            return reply.usage.prompt_tokens_details.cached_tokens

        assert cached("sk-alice-0001") == 0  # a cold cache
        assert cached("sk-bob-00001") == 0  # alice's blocks are not bob's to find
        assert cached("sk-alice-0001") > 0  # but alice's own are
