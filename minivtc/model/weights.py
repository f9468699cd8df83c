"""Load a Hugging Face-format Llama directory: config.json, safetensors shards, tokenizer.model.

Owns: finding and validating the files, and filling a `Llama` one tensor at a time. The model is
first built on PyTorch's "meta" device (shapes, no memory); each tensor is then read from its
safetensors file, cast to the chosen dtype, moved to the chosen device and put in place, so a 7B
model in fp16 (13.5 GB) fits on a 24 GB A10G with no second copy in host or device memory.
Only safetensors are read: `.bin` checkpoints are pickles, and unpickling runs arbitrary code.
A checkpoint is data from whoever published it, so the shards that a sharded checkpoint's index
names are confined to the checkpoint directory (`shard_path`): the index cannot make the loader
open any other file this user can read.

Does not own: the model's shape (`config.py`) or its forward pass (`llama.py`). Lesson 1.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from minivtc.model.config import LlamaConfig
from minivtc.model.llama import Llama
from minivtc.model.packed import pack_linears
from minivtc.model.tokenizer import Tokenizer

__all__ = ["BUNDLED_WEIGHTS", "CheckpointError", "DTYPES", "bundled_weights_dir", "load_config"]
__all__ += ["load_model", "resolve_dtype"]

BUNDLED_WEIGHTS = Path(__file__).resolve().parents[2] / "weights"  # the repository's weights/
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# vLLM's dtype names (config.json's `torch_dtype` among them), and minivtc's, as minivtc's
DTYPE_NAMES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16"}
DTYPE_NAMES |= {"bfloat16": "bf16"} | {name: name for name in DTYPES}
# Rotary frequencies are recomputed from the config; some exports store them anyway.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded; the message names the problem."""


def load_model(
    weights_dir: str | Path | None = None,
    dtype: str | torch.dtype = "fp32",
    device: str = "cpu",
    packed: bool = False,
    compiled: bool = False,
) -> tuple[Llama, Tokenizer]:
    """The model (eval mode, no gradients) and its tokenizer; the bundled model by default.
    `packed`: its linear layers packed for the CPU's oneDNN kernels (`packed.py`); `compiled`:
    its forward pass compiled whole, inductor packing the weights (`compiled.py`)."""
    if packed and compiled:
        raise ValueError("packed or compiled, not both: compiling packs the weights itself")
    root = Path(weights_dir) if weights_dir is not None else bundled_weights_dir()
    config = load_config(root)
    tokenizer = Tokenizer(require_file(root / "tokenizer.model"))
    if tokenizer.vocab_size != config.vocab_size:
        raise CheckpointError(
            f"{root / 'tokenizer.model'} has {tokenizer.vocab_size} tokens but config.json says "
            f"vocab_size={config.vocab_size}"
        )
    model = load_weights(config, root, resolve_dtype(dtype, root, device), torch.device(device))
    if packed:
        pack_linears(model)
    if compiled:  # (imported here: a plain load registers no compiled operator)
        from minivtc.model.compiled import compile_model

        compile_model(model)
    return model, tokenizer


def bundled_weights_dir() -> Path:
    """`weights/` in a source checkout (an editable install, as the README does)."""
    if not (BUNDLED_WEIGHTS / "config.json").is_file():
        raise CheckpointError(
            f"the bundled model is not at {BUNDLED_WEIGHTS}; pass --weights DIR "
            "(install from a source checkout with `pip install -e .` to use the bundled model)"
        )
    return BUNDLED_WEIGHTS


def resolve_dtype(dtype: str | torch.dtype, root: Path, device: str | torch.device) -> torch.dtype:
    """The weights' dtype: a torch dtype as it is, or a name, minivtc's or vLLM's; "auto" is
    the checkpoint's own (`torch_dtype` in `root`'s config.json; fp32 if it names none), except
    fp16 on a CPU, which runs as fp32. The one rule: `load_model`, `LLM(dtype=...)`
    (`offline/llm.py`) and `minivtc serve --dtype` (`serving/vllm_flags.py`) call it."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        name = DTYPE_NAMES.get(str(hf_config(root).get("torch_dtype")), "fp32")  # none: fp32
        return DTYPES["fp32" if name == "fp16" and torch.device(device).type == "cpu" else name]
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype!r}; choose 'auto' or one of {sorted(DTYPE_NAMES)}")
    return DTYPES[DTYPE_NAMES[dtype]]


def load_config(root: Path) -> LlamaConfig:
    hf, path = hf_config(root), root / "config.json"
    try:
        return LlamaConfig.from_hf(hf)
    except KeyError as e:
        raise CheckpointError(f"{path} lacks the field {e.args[0]!r}") from e
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from e


def hf_config(root: Path) -> dict[str, Any]:
    """`root`'s config.json, as Hugging Face wrote it."""
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {root}")
    path = require_file(root / "config.json")
    try:
        hf: dict[str, Any] = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e
    return hf


def require_file(path: Path) -> Path:
    if not path.is_file():
        raise CheckpointError(f"missing file: {path}")
    return path


def load_weights(
    config: LlamaConfig, root: Path, dtype: torch.dtype, device: torch.device
) -> Llama:
    with torch.device("meta"):
        model = Llama(config)
    expected = {name: p.shape for name, p in model.named_parameters()}
    seen: set[str] = set()
    for file, names in shard_map(root).items():
        with open_safetensors(file) as f:
            for hf_name in names:
                name = hf_name.removeprefix("model.")
                if name.endswith(IGNORED_SUFFIXES):
                    continue
                if name not in expected:
                    raise CheckpointError(f"unexpected tensor {hf_name!r} in {file.name}")
                tensor = f.get_tensor(hf_name)
                if tensor.shape != expected[name]:
                    raise CheckpointError(
                        f"tensor {hf_name!r} in {file.name} has shape {tuple(tensor.shape)}, "
                        f"expected {tuple(expected[name])} from config.json"
                    )
                set_parameter(model, name, tensor.to(device=device, dtype=dtype))
                seen.add(name)
    missing = sorted(set(expected) - seen)
    if missing:
        raise CheckpointError(f"missing tensors: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    return model.eval().requires_grad_(False)


def shard_map(root: Path) -> dict[Path, list[str]]:
    """{safetensors file: tensor names in it}, from the index for sharded checkpoints."""
    index = root / "model.safetensors.index.json"
    if index.is_file():
        names_by_shard: dict[str, list[str]] = {}
        for name, shard in read_weight_map(index).items():
            names_by_shard.setdefault(shard, []).append(name)
        files: dict[Path, list[str]] = {}
        for shard, names in names_by_shard.items():
            # extend, not assign: "a.safetensors" and "./a.safetensors" are one file
            files.setdefault(shard_path(index, shard), []).extend(names)
        return files
    single = root / "model.safetensors"
    if not single.is_file():
        pickles = sorted(p.name for p in root.glob("*.bin"))
        hint = f" (found {pickles}: pickled checkpoints are never loaded)" if pickles else ""
        raise CheckpointError(f"missing file: {single} or {index.name}{hint}")
    with open_safetensors(single) as f:
        return {single: list(f.keys())}


def read_weight_map(index: Path) -> dict[str, str]:
    """The index's {tensor name: shard file name}, each name a string."""
    try:
        contents = json.loads(index.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{index} is not valid JSON: {e}") from e
    weight_map = contents.get("weight_map") if isinstance(contents, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index} has no 'weight_map'")
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise bad_shard(index, shard, f"not a file name (the shard of {name!r})")
    return weight_map


def shard_path(index: Path, shard: str) -> Path:
    """The real path of the shard the index names, refused unless it is a file inside the
    checkpoint directory. Without this, `../../x`, `/etc/passwd` or a symlink out of the
    directory would have the loader open, and report bytes of, any file this user can read."""
    root = index.parent
    inside = root.resolve()
    if Path(shard).is_absolute():
        raise bad_shard(index, shard, f"an absolute path; a shard must be a file in {root}")
    # normpath is lexical: it catches `..` before any file is touched; resolve() then follows links
    if not Path(os.path.normpath(inside / shard)).is_relative_to(inside):
        raise bad_shard(index, shard, f"'..' leads out of the checkpoint directory {root}")
    try:
        path = (root / shard).resolve()
    except (OSError, RuntimeError, ValueError) as e:  # a symlink loop, a NUL byte in the name
        raise bad_shard(index, shard, f"cannot be resolved ({e})") from e
    if not any(path.is_relative_to(d) for d in checkpoint_dirs(inside)):
        raise bad_shard(index, shard, f"a symlink leads out of the checkpoint directory, to {path}")
    if not path.is_file():
        raise bad_shard(index, shard, f"missing file {root / shard}")
    return path


def checkpoint_dirs(root: Path) -> list[Path]:
    """Where the files of the checkpoint at `root` (a resolved path) may really lie: `root`; and,
    when `root` is a snapshot in the Hugging Face hub cache (`models--ORG--NAME/snapshots/REV/`),
    that repository's `blobs/`, which the snapshot's symlinks point into. Refusing those links
    would refuse every sharded model fetched with `huggingface_hub.snapshot_download`."""
    repo = root.parent.parent
    if root.parent.name == "snapshots" and repo.name.startswith("models--"):
        return [root, repo / "blobs"]
    return [root]


def bad_shard(index: Path, shard: object, why: str) -> CheckpointError:
    return CheckpointError(f"{index} names the shard {shard!r}: {why}")


def open_safetensors(path: Path) -> safe_open:
    """`safe_open`, with a file that is not safetensors reported by name, not by a traceback."""
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path} is not a readable safetensors file: {e}") from e


def set_parameter(model: Llama, name: str, tensor: torch.Tensor) -> None:
    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name)
    setattr(module, attr, torch.nn.Parameter(tensor, requires_grad=False))
