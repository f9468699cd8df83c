"""Packed linear layers for the CPU: the model's matrix products through oneDNN, each weight laid
out once, at load, in the blocked order its kernels read.

Owns `PackedLinear` (a bias-free linear layer whose weight oneDNN has laid out) and
`pack_linears` (swap every linear layer of a model for one, in place, fusing the products that
share an input). Does not own the model: `llama.py`'s plain `nn.Linear` path stays the
reference, and `tests/test_packed.py` compares the two.

Why: on a CPU, `nn.Linear` in fp32 calls the BLAS PyTorch was built with (MKL), which takes the
weight as it lies in memory and repacks panels of it on every call; oneDNN can pack a weight once
and then stream it in the order its AVX-512 kernels consume (one product, and the whole engine,
measured both ways: `minivtc/bench/README.md`). A call also has a fixed cost whatever its
size, so the products that read the same input are made one: q, k and v, and gate and up (21
calls a step for the bundled model, not 36). `minivtc bench peer --minivtc-modes packed,plain`
measures the whole engine both ways; `compiled.py` goes further (the whole forward compiled).

The results differ from the plain path by float rounding only (the sums are taken in another
order): about 1e-6 relative in fp32, so a greedy token whose two best logits are that close
may change. CPU only: a packed weight cannot move to a GPU, and nothing trains through it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor, nn

from minivtc.model.llama import DecoderLayer, Llama

__all__ = ["PackedLinear", "can_pack", "fuse_linears", "pack_linears", "packs_on"]


class PackedLinear(nn.Module):
    """y = x W^T, as `nn.Linear(bias=False)` (Llama's have no bias), W packed by oneDNN.
    x: (T, in) -> (T, out)."""

    weight: Tensor

    def __init__(self, weight: Tensor) -> None:  # (out, in), as nn.Linear's
        super().__init__()
        self.out_features, self.in_features = weight.shape
        # the layout oneDNN's kernels read, made once (what torch.compile's freezing makes too)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        self.register_buffer("weight", packed, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = torch.ops.mkldnn._linear_pointwise(x, self.weight, None, "none", [], "")
        return out


def pack_linears(model: Llama) -> Llama:
    """Pack every linear layer of `model` (on the CPU) for oneDNN, in place, the products that
    read the same input fused (`fuse_linears`)."""
    if model.embed_tokens.weight.device.type != "cpu":
        raise ValueError("packing is for the CPU only")
    return fuse_linears(model, PackedLinear)


def fuse_linears(model: Llama, make: Callable[[Tensor], nn.Module]) -> Llama:
    """Replace every linear layer of `model` by `make(weight)`, in place, fusing the products
    that read the same input: each layer's q, k and v weights stacked into one
    (`SelfAttention.qkv_proj`), and gate and up (`SwiGLU.gate_up_proj`), since a product has a
    fixed cost whatever its size, which at one token is a large share of the step (its size:
    `minivtc/bench/README.md`).
    `make`: `PackedLinear` here; `compiled.py` keeps plain layers for inductor to pack."""
    # setattr: llama.py types these attributes nn.Linear; the made layer takes each one's place
    for layer in model.layers:
        attention, mlp = cast(DecoderLayer, layer).self_attn, cast(DecoderLayer, layer).mlp
        attention.qkv_proj = make(stacked(attention, ["q_proj", "k_proj", "v_proj"]))
        setattr(attention, "o_proj", make(attention.o_proj.weight))  # noqa: B010
        mlp.gate_up_proj = make(stacked(mlp, ["gate_proj", "up_proj"]))
        setattr(mlp, "down_proj", make(mlp.down_proj.weight))  # noqa: B010
    setattr(model, "lm_head", make(model.lm_head.weight))  # noqa: B010
    return model


def stacked(module: nn.Module, names: list[str]) -> Tensor:
    """The weights of `module`'s linears `names` (same input) stacked along the output, the
    separate layers removed (their memory is the fused one's): (sum of outs, in)."""
    weights = torch.cat([getattr(module, name).weight for name in names])
    for name in names:
        delattr(module, name)
    return weights


def packs_on(device: str | torch.device, dtype: torch.dtype) -> bool:
    """Whether a server or `LLM` packs its model: on a CPU, in fp32 or bf16 (oneDNN's fp16
    products need AVX512-FP16, which few CPUs have), where this build has oneDNN. The lessons
    and the tests of the model read the plain path."""
    cpu = torch.device(device).type == "cpu"
    return cpu and dtype in (torch.float32, torch.bfloat16) and can_pack()


def can_pack() -> bool:
    """Whether this PyTorch build has oneDNN (x86 and ARM wheels do)."""
    return bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]
