"""`EngineConfig` (`engine/engine_config.py`): which engine, one value every front door builds.
Each refusal is made here, once, with its message; the keywords every front door takes are the
config's fields; the engine reads its options from the config it was built with."""

import math

import pytest
import torch

from minivtc.engine.engine_config import CONFIG_FIELDS, ENGINE_OPTIONS, EngineConfig
from minivtc.engine.factory import build_engine
from minivtc.model.llama import Llama
from minivtc.sim.simulator import simulate
from minivtc.sim.workloads import TraceRequest
from tests.conftest import TINY_GQA

REFUSALS = [
    ({"kv_tokens": 64, "kv_bytes": 1 << 20}, "give kv_tokens or kv_bytes, not both"),
    ({"kv_tokens": 0}, "a KV pool of 0 tokens holds nothing: give at least one block"),
    ({"block_size": 0}, "block_size must be >= 1, got 0"),
    ({"reservation": "some"}, "reservation must be one of 'full', 'peak', 'none', got 'some'"),
    ({"victim": "fair"}, "victim only means something with reservation 'none'"),
    (
        {"reservation": "peak", "victim": "fair", "preempt_gap": 8.0},
        "victim, preempt_gap only mean something with reservation 'none' (blocks on demand), "
        "not 'peak'",
    ),
    ({"reservation": "none", "victim": "old"}, "victim must be one of 'latest', 'fair'"),
    ({"reservation": "none", "preemption": "drop"}, "preemption must be one of 'recompute'"),
    ({"reservation": "none", "preempt_gap": 8.0}, "preempt_gap only means something with victim"),
    (
        {"reservation": "none", "victim": "fair", "preempt_gap": math.nan},
        "preempt_gap must be >= 0 (inf: never displace), got nan",
    ),
    ({"reservation": "none", "swap_tokens": 8}, "swap_tokens only means something with preempt"),
    (
        {"reservation": "none", "preemption": "swap", "swap_tokens": -1},
        "swap_tokens must be >= 0, got -1",
    ),
    (
        {"reservation": "none", "victim": "fair", "admit_every": 3, "check_fairness": True},
        "check_fairness: the preemptive bound needs a displacement round every step",
    ),
    ({"admit_every": 0}, "admit_every and max_running must be >= 1, got 0, 256"),
    ({"max_running": 0}, "admit_every and max_running must be >= 1, got 1, 0"),
    ({"max_model_len": 0}, "max_model_len must be >= 1, got 0"),
]


@pytest.mark.parametrize(("keywords", "why"), REFUSALS)
def test_each_refusal_is_the_configs(keywords, why):
    with pytest.raises(ValueError) as refused:
        EngineConfig.of("vtc", **keywords)
    assert str(refused.value).startswith(why)


def test_one_way_from_keywords():
    """The policy first or among the keywords; a config as it is, never with keywords too."""
    config = EngineConfig.of("vtc", kv_tokens=64, reservation="none", victim="fair")
    assert EngineConfig.of(policy="vtc", kv_tokens=64, reservation="none", victim="fair") == config
    assert EngineConfig.of(config) is config
    assert EngineConfig.of().policy == "fcfs"
    with pytest.raises(TypeError, match="give a config or its keywords, not both"):
        EngineConfig.of(config, kv_tokens=32)
    with pytest.raises(TypeError, match="unexpected keyword argument 'options'"):
        EngineConfig.of("vtc", options={"reservation": "none"})  # flat: no nested options
    assert set(ENGINE_OPTIONS) < CONFIG_FIELDS
    assert config.options()["victim"] == "fair" and "kv_tokens" not in config.options()


def test_llm_takes_the_configs_fields():
    """`LLM(...)`'s own keywords are the config's fields (and the clock), no list of its own."""
    from minivtc.offline.llm import ENGINE_KEYWORDS

    assert ENGINE_KEYWORDS == CONFIG_FIELDS | {"clock"}


def test_the_engine_reads_its_options_from_the_config():
    torch.manual_seed(0)
    config = EngineConfig.of(
        "vtc", kv_tokens=64, block_size=4, reservation="none", victim="fair", max_model_len=48
    )
    engine = build_engine(Llama(TINY_GQA).eval(), None, config)
    assert engine.config is config and engine.max_positions == 48
    assert engine.scheduler.name == "vtc" and engine.victim is not None
    assert engine.allocator.num_tokens == 64 and engine.allocator.block_size == 4


def test_the_simulator_refuses_what_needs_a_model_or_a_device():
    trace = [TraceRequest("a", 0.0, 4, 4)]
    for keywords in ({"compile_attention": True}, {"max_model_len": 64}):
        with pytest.raises(TypeError, match="simulate runs no model"):
            simulate(trace, "vtc", **keywords)
    with pytest.raises(ValueError, match="simulate's pool is in tokens"):
        simulate(trace, "vtc", kv_bytes=1 << 20)
    with pytest.raises(TypeError, match="it takes no max_running"):
        simulate(trace, "vtc", max_running=4)
    assert len(simulate(trace, EngineConfig("vtc", block_size=1)).served) == 1


def test_the_fleet_takes_only_what_each_replica_may_choose():
    from minivtc.fleet.replicas import simulate_fleet

    trace = [TraceRequest("a", 0.0, 4, 4)]
    for keywords in ({"prefix_caching": True}, {"max_model_len": 64}, {"admit_every": 2}):
        with pytest.raises(ValueError, match="of the rest only weights, seed and check_fairness"):
            simulate_fleet(trace, 2, "global", **keywords)
    assert len(simulate_fleet(trace, 2, "global", kv_tokens=64, seed=3).result.served) == 1
