"""Load a Hugging Face-format Llama directory: config.json, safetensors shards, tokenizer.model.

Owns: finding and validating the files, and filling a `Llama` one tensor at a time. The model is
first built on PyTorch's "meta" device (shapes, no memory); each tensor is then read from its
safetensors file, cast to the chosen dtype, moved to the chosen device and put in place, so a 7B
model in fp16 (13.5 GB) fits on a 24 GB A10G with no second copy in host or device memory.
Only safetensors are read: `.bin` checkpoints are pickles, and unpickling runs arbitrary code.

Does not own: the model's shape (`config.py`) or its forward pass (`model.py`). Lesson 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from minivtc.config import LlamaConfig
from minivtc.model import Llama
from minivtc.tokenizer import Tokenizer

BUNDLED_WEIGHTS = Path(__file__).resolve().parent.parent / "weights"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Rotary frequencies are recomputed from the config; some exports store them anyway.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded; the message names the problem."""


def load_model(
    weights_dir: str | Path | None = None, dtype: str | torch.dtype = "fp32", device: str = "cpu"
) -> tuple[Llama, Tokenizer]:
    """The model (eval mode, no gradients) and its tokenizer; the bundled model by default."""
    root = Path(weights_dir) if weights_dir is not None else bundled_weights_dir()
    config = load_config(root)
    tokenizer = Tokenizer(require_file(root / "tokenizer.model"))
    if tokenizer.vocab_size != config.vocab_size:
        raise CheckpointError(
            f"{root / 'tokenizer.model'} has {tokenizer.vocab_size} tokens but config.json says "
            f"vocab_size={config.vocab_size}"
        )
    model = load_weights(config, root, resolve_dtype(dtype), torch.device(device))
    return model, tokenizer


def bundled_weights_dir() -> Path:
    """`weights/` in a source checkout (an editable install, as the README does)."""
    if not (BUNDLED_WEIGHTS / "config.json").is_file():
        raise CheckpointError(
            f"the bundled model is not at {BUNDLED_WEIGHTS}; pass --weights DIR "
            "(install from a source checkout with `pip install -e .` to use the bundled model)"
        )
    return BUNDLED_WEIGHTS


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def load_config(root: Path) -> LlamaConfig:
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {root}")
    path = require_file(root / "config.json")
    try:
        hf = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e
    try:
        return LlamaConfig.from_hf(hf)
    except KeyError as e:
        raise CheckpointError(f"{path} lacks the field {e.args[0]!r}") from e
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from e


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
        with safe_open(str(file), framework="pt", device="cpu") as f:
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
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index} has no 'weight_map'")
        files: dict[Path, list[str]] = {}
        for name, file in weight_map.items():
            files.setdefault(root / file, []).append(name)
        for file in files:
            require_file(file)
        return files
    single = root / "model.safetensors"
    if not single.is_file():
        pickles = sorted(p.name for p in root.glob("*.bin"))
        hint = f" (found {pickles}: pickled checkpoints are never loaded)" if pickles else ""
        raise CheckpointError(f"missing file: {single} or {index.name}{hint}")
    with safe_open(str(single), framework="pt", device="cpu") as f:
        return {single: list(f.keys())}


def set_parameter(model: Llama, name: str, tensor: torch.Tensor) -> None:
    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name)
    setattr(module, attr, torch.nn.Parameter(tensor, requires_grad=False))
