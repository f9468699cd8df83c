"""Checkpoint loading: sharded files, dtypes, and a clear error for every malformed input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from minivtc.model.weights import CheckpointError, load_model, resolve_dtype
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


@pytest.mark.parametrize(
    "dtype, torch_dtype",
    [("bfloat16", torch.bfloat16), ("half", torch.float16), ("float", torch.float32)],
)
def test_vllms_dtype_names_are_read_at_load(ckpt, dtype, torch_dtype):
    model, _ = load_model(ckpt, dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {torch_dtype}


@pytest.mark.parametrize(
    "saved, device, torch_dtype",
    [
        ("bfloat16", "cpu", torch.bfloat16),
        ("float16", "cuda", torch.float16),
        ("float16", "cpu", torch.float32),  # fp16 on a CPU runs as fp32
        (None, "cpu", torch.float32),  # a config.json that names none
    ],
)
def test_auto_is_the_checkpoints_own_dtype(ckpt, saved, device, torch_dtype):
    hf = json.loads((ckpt / "config.json").read_text())
    hf.pop("torch_dtype", None)
    (ckpt / "config.json").write_text(json.dumps(hf | ({"torch_dtype": saved} if saved else {})))
    assert resolve_dtype("auto", ckpt, device) == torch_dtype
    if device == "cpu":
        model, _ = load_model(ckpt, dtype="auto")
        assert {p.dtype for p in model.parameters()} == {torch_dtype}


def test_an_unknown_dtype_is_refused_by_name(ckpt):
    with pytest.raises(ValueError, match="unknown dtype 'float8'; choose 'auto' or one of"):
        load_model(ckpt, dtype="float8")


def test_one_rule_reads_a_dtype():
    """`load_model`, `LLM(dtype=...)` and `minivtc serve --dtype` read a dtype with the same
    function: no module defines another."""
    package = Path(__file__).resolve().parents[1] / "minivtc"
    defined = [
        str(path.relative_to(package))
        for path in sorted(package.rglob("*.py"))
        if re.search(r"^def resolve_dtype\(", path.read_text(), re.MULTILINE)
    ]
    assert defined == ["model/weights.py"]


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


# Sharded checkpoints whose index names its shards. The index is data from whoever published the
# checkpoint, so every shard it names must be a file inside the checkpoint directory.
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def write_index(ckpt, weight_map: dict) -> None:
    index = {"metadata": {}, "weight_map": weight_map}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))


def shard(ckpt) -> dict[str, str]:
    """Split the single file into two shards and an index, as `save_pretrained` does for a big
    model; the weight map {tensor name: shard file}."""
    tensors = load_file(ckpt / "model.safetensors")
    names = sorted(tensors)
    weight_map = {}
    for file, part in zip(SHARDS, (names[::2], names[1::2]), strict=True):
        save_file({n: tensors[n] for n in part}, ckpt / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    (ckpt / "model.safetensors").unlink()
    write_index(ckpt, weight_map)
    return weight_map


def rename_shard(ckpt, weight_map: dict[str, str], new_name) -> None:
    """Make the index name the second shard `new_name` instead."""
    write_index(ckpt, {k: new_name if v == SHARDS[1] else v for k, v in weight_map.items()})


def assert_same_parameters(a, b) -> None:
    for (name, x), (_, y) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(x, y), name


def test_hand_sharded_checkpoint_loads_like_single(ckpt):
    single, _ = load_model(ckpt)
    shard(ckpt)
    assert_same_parameters(load_model(ckpt)[0], single)


def test_shard_may_name_a_subfolder_and_dotdot_that_stays_inside(ckpt):
    single, _ = load_model(ckpt)
    weight_map = shard(ckpt)
    (ckpt / "part").mkdir()
    (ckpt / SHARDS[1]).rename(ckpt / "part" / SHARDS[1])
    rename_shard(ckpt, weight_map, f"part/../part/{SHARDS[1]}")
    assert_same_parameters(load_model(ckpt)[0], single)


def test_shard_outside_the_directory_through_dotdot_is_refused(ckpt):
    weight_map = shard(ckpt)
    (ckpt / SHARDS[1]).rename(ckpt.parent / "outside.safetensors")  # a real file: it would load
    rename_shard(ckpt, weight_map, "../outside.safetensors")
    with pytest.raises(
        CheckpointError,
        match=r"index.json names the shard '\.\./outside\.safetensors': '\.\.' leads out",
    ):
        load_model(ckpt)


@pytest.mark.parametrize("target", ["/etc/passwd", "outside"])
def test_shard_named_by_an_absolute_path_is_refused(ckpt, target):
    weight_map = shard(ckpt)
    outside = ckpt.parent / "outside.safetensors"
    (ckpt / SHARDS[1]).rename(outside)
    name = str(outside) if target == "outside" else target
    rename_shard(ckpt, weight_map, name)
    with pytest.raises(
        CheckpointError, match=f"names the shard {re.escape(repr(name))}: an absolute path"
    ):
        load_model(ckpt)


def test_shard_symlink_out_of_the_directory_is_refused(ckpt):
    shard(ckpt)
    outside = ckpt.parent / "outside.safetensors"
    (ckpt / SHARDS[1]).rename(outside)
    (ckpt / SHARDS[1]).symlink_to(f"../{outside.name}")  # the index is untouched
    with pytest.raises(
        CheckpointError, match=f"names the shard '{SHARDS[1]}': a symlink leads out of"
    ):
        load_model(ckpt)


def test_missing_shard_is_named(ckpt):
    shard(ckpt)
    (ckpt / SHARDS[1]).unlink()
    with pytest.raises(
        CheckpointError, match=f"index.json names the shard '{SHARDS[1]}': missing file"
    ):
        load_model(ckpt)


def test_shard_that_is_not_safetensors_is_named(ckpt):
    rename_shard(ckpt, shard(ckpt), "config.json")
    with pytest.raises(CheckpointError, match="config.json is not a readable safetensors file"):
        load_model(ckpt)


@pytest.mark.parametrize(
    "index,message",
    [
        ("{not json", "index.json is not valid JSON"),
        ('["a list"]', "index.json has no 'weight_map'"),
        ('{"weight_map": {"model.norm.weight": 3}}', "names the shard 3: not a file name"),
    ],
)
def test_malformed_index(ckpt, index, message):
    shard(ckpt)
    (ckpt / "model.safetensors.index.json").write_text(index)
    with pytest.raises(CheckpointError, match=message):
        load_model(ckpt)


def test_hugging_face_cache_snapshot_loads(ckpt, tmp_path):
    """The hub cache keeps each file once in `blobs/` and links to it from `snapshots/REV/`:
    those links leave the snapshot directory, and must still load."""
    single, _ = load_model(ckpt)
    shard(ckpt)
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abc"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, file in enumerate(sorted(ckpt.iterdir())):
        file.rename(repo / "blobs" / f"blob{i}")
        (snapshot / file.name).symlink_to(f"../../blobs/blob{i}")
    assert_same_parameters(load_model(snapshot)[0], single)
