"""minivtc: a readable, pure-PyTorch engine for fair LLM serving.

A Llama-2 model, a paged KV pool, continuous batching and the Virtual Token Counter (VTC) fair
scheduler of *Fairness in Serving Large Language Models* (Sheng et al., OSDI 2024), with a
simulator that runs the same engine and scheduler on a virtual clock. README.md has the tour, the
layout (one line per file) and the glossary; the lessons teach it file by file.

The package exports vLLM's offline API, so vLLM's spelling works::

    from minivtc import LLM, SamplingParams

    LLM().generate(["A tuple is"], SamplingParams(temperature=0, max_tokens=24))

The exports are imported on first use (PEP 562's module `__getattr__`): `import minivtc` alone
does not import torch, so the command line's `--help` stays quick.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # type checkers and editors see the real names
    from minivtc.engine.sampler import SamplingParams
    from minivtc.offline.llm import LLM
    from minivtc.offline.outputs import CompletionOutput, RequestOutput

__all__ = ["CompletionOutput", "LLM", "RequestOutput", "SamplingParams"]

# exported name: the module that defines it (vLLM's top-level names)
EXPORTS = {
    "LLM": "minivtc.offline.llm",
    "SamplingParams": "minivtc.engine.sampler",
    "RequestOutput": "minivtc.offline.outputs",
    "CompletionOutput": "minivtc.offline.outputs",
}


def __getattr__(name: str) -> object:
    """`minivtc.LLM`, `minivtc.SamplingParams` and the output types, imported when first
    asked for."""
    if name not in EXPORTS:
        raise AttributeError(f"module 'minivtc' has no attribute {name!r}")
    return getattr(importlib.import_module(EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
