"""Checkpoint loading: sharded files, dtypes, and a clear error for every malformed input."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from minivtc.weights import CheckpointError, load_model
from tests.conftest import TINY_GQA, write_hf_checkpoint


@pytest.fixture
def ckpt(tmp_path):
    return write_hf_checkpoint(TINY_GQA, tmp_path / "ckpt")


def test_sharded_checkpoint_loads_like_single(ckpt, tmp_path):
    transformers = pytest.importorskip("transformers")
    sharded = tmp_path / "sharded"
    hf = transformers.LlamaForCausalLM.from_pretrained(ckpt)
    hf.save_pretrained(sharded, safe_serialization=True, max_shard_size="100KB")
    (sharded / "tokenizer.model").write_bytes((ckpt / "tokenizer.model").read_bytes())
    assert (sharded / "model.safetensors.index.json").is_file()
    single, _ = load_model(ckpt)
    multi, _ = load_model(sharded)
    for (name, a), (_, b) in zip(single.named_parameters(), multi.named_parameters(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("dtype,torch_dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_dtype_chosen_at_load(ckpt, dtype, torch_dtype):
    model, _ = load_model(ckpt, dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {torch_dtype}
    assert not any(p.requires_grad for p in model.parameters())


def rewrite_tensors(ckpt, edit) -> None:
    tensors = load_file(ckpt / "model.safetensors")
    edit(tensors)
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint directory not found"):
        load_model(tmp_path / "nope")


@pytest.mark.parametrize("name", ["config.json", "tokenizer.model", "model.safetensors"])
def test_missing_file(ckpt, name):
    (ckpt / name).unlink()
    with pytest.raises((CheckpointError, FileNotFoundError), match="missing file|not found"):
        load_model(ckpt)


def test_pickle_checkpoint_is_refused_by_name(ckpt):
    (ckpt / "model.safetensors").rename(ckpt / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pickled checkpoints are never loaded"):
        load_model(ckpt)


def test_missing_tensor(ckpt):
    rewrite_tensors(ckpt, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(
        CheckpointError, match=r"missing tensors: \['layers.1.mlp.up_proj.weight'\]"
    ):
        load_model(ckpt)


def test_unexpected_tensor(ckpt):
    rewrite_tensors(ckpt, lambda t: t.update({"model.extra.weight": torch.zeros(3)}))
    with pytest.raises(CheckpointError, match="unexpected tensor 'model.extra.weight'"):
        load_model(ckpt)


def test_wrong_shape(ckpt):
    rewrite_tensors(ckpt, lambda t: t.update({"model.norm.weight": torch.ones(65)}))
    with pytest.raises(
        CheckpointError, match=r"'model.norm.weight'.*shape \(65,\), expected \(64,\)"
    ):
        load_model(ckpt)


@pytest.mark.parametrize(
    "change,message",
    [
        (
            {"model_type": "mistral", "architectures": ["MistralForCausalLM"]},
            "unsupported architecture",
        ),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        (
            {"vocab_size": 5000},
            "tokenizer.model has 4096 tokens but config.json says vocab_size=5000",
        ),
    ],
)
def test_bad_config(ckpt, change, message):
    path = ckpt / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(CheckpointError, match=message):
        load_model(ckpt)


def test_config_missing_field(ckpt):
    path = ckpt / "config.json"
    cfg = json.loads(path.read_text())
    del cfg["hidden_size"]
    path.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="lacks the field 'hidden_size'"):
        load_model(ckpt)


def test_config_not_json(ckpt):
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_model(ckpt)
