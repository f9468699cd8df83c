"""Packed linear layers for the CPU: the model's matrix products through oneDNN with each weight
laid out once, at load, in the blocked order its kernels read.

Owns `PackedLinear` (an `nn.Linear` whose weight is a oneDNN tensor) and `pack_linears` (swap
every linear of a model for one, in place). Does not own the model (`llama.py`, whose plain
`nn.Linear` path stays the reference: `tests/test_packed.py` compares the two).

Why: on a CPU, `nn.Linear` in fp32 calls the BLAS PyTorch was built with (MKL), which takes the
weight as it lies in memory and repacks panels of it on every call; oneDNN can pack a weight once
and then stream it in the order its AVX-512 kernels consume. At one token the product is bound by
memory bandwidth either way, and the two run level; at 16 and 64 tokens, where the arithmetic
counts, the packed product of a 2048 x 5632 weight took about half the CPU time (one thread, this
2-core AMD EPYC: `minivtc bench peer --minivtc-plain` measures the whole engine both ways). In
bf16, PyTorch already goes through oneDNN, so packing changes little there. The results differ
from the plain path by float rounding only (the sums are taken in another order): 1e-6
relative in fp32; an fp32 logit may move by that much, and a greedy token whose two best logits
are that close may change.

CPU only: a packed weight cannot move to a GPU, and training through it is not supported.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class PackedLinear(nn.Module):
    """y = x W^T, as `nn.Linear(bias=False)`, W packed by oneDNN. x: (T, in) -> (T, out)."""

    weight: Tensor
    bias: Tensor

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        if linear.bias is not None:
            raise ValueError("PackedLinear: Llama's linear layers have no bias")
        weight = linear.weight.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", weight.to_mkldnn(weight.dtype), persistent=False)
        # oneDNN's linear takes a bias; a zero one in fp32 (its accumulation type) adds nothing
        self.register_buffer("bias", torch.zeros(self.out_features).to_mkldnn(), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        out = torch._C._nn.mkldnn_linear(x.contiguous().to_mkldnn(), self.weight, self.bias)
        return out.to_dense()


def pack_linears(model: nn.Module) -> nn.Module:
    """Swap every `nn.Linear` of `model` (on the CPU) for a `PackedLinear`, in place."""
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                if child.weight.device.type != "cpu":
                    raise ValueError(f"{name}.{child_name}: packing is for the CPU only")
                setattr(module, child_name, PackedLinear(child))
    return model


def can_pack() -> bool:
    """Whether this PyTorch build has oneDNN (x86 and ARM wheels do)."""
    return bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]
