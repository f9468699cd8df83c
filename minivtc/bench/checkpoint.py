"""`minivtc bench checkpoint`: a Llama checkpoint of a preset's shape with random weights, in
Hugging Face layout, so every engine here loads it (minivtc, vLLM, `transformers`). Nothing is
downloaded: benchmarks of shapes where the matrix multiplies and the KV reads dominate need one.

    minivtc bench checkpoint --preset bench-1b --out /tmp/bench-1b   # 1.07B parameters

The directory gets `config.json` (`LlamaConfig.to_hf`), `model.safetensors` (Hugging Face's
tensor names: `model.` before every name but `lm_head`) and the bundled `tokenizer.model`, so the
preset's vocabulary must be the bundled tokenizer's (4096 ids; `bench-1b` is). Weights are drawn
from N(0, 0.02) with a fixed seed (norms are ones), so two runs write the same bytes. Random
weights make text without meaning, and timing does not care: the arithmetic is the same.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from minivtc.model.config import LlamaConfig, preset
from minivtc.model.llama import Llama
from minivtc.model.weights import bundled_weights_dir

__all__ = ["write_checkpoint"]

SEED, STD = 0, 0.02


def write_checkpoint(preset_name: str, out: str | Path) -> Path:
    config = preset(preset_name)
    bundled = bundled_weights_dir()
    vocab = json.loads((bundled / "config.json").read_text())["vocab_size"]
    if config.vocab_size != vocab:
        raise ValueError(
            f"preset {preset_name!r} has a vocabulary of {config.vocab_size}, the bundled "
            f"tokenizer {vocab}: a checkpoint here carries the bundled tokenizer"
        )
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    print(f"{preset_name}: {config.num_params / 1e9:.2f}B parameters -> {root}", flush=True)
    save_file(random_tensors(config), str(root / "model.safetensors"), metadata={"format": "pt"})
    (root / "config.json").write_text(json.dumps(config.to_hf(), indent=2) + "\n")
    shutil.copy(bundled / "tokenizer.model", root / "tokenizer.model")
    return root


def random_tensors(config: LlamaConfig) -> dict[str, torch.Tensor]:
    """Every parameter of the model, by its Hugging Face name, drawn in a fixed order."""
    with torch.device("meta"):
        shapes = {name: p.shape for name, p in Llama(config).named_parameters()}
    generator = torch.Generator().manual_seed(SEED)
    tensors = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            tensor = torch.ones(shape)
        else:
            tensor = torch.empty(shape).normal_(0.0, STD, generator=generator)
        tensors[name if name.startswith("lm_head") else f"model.{name}"] = tensor
    return tensors
