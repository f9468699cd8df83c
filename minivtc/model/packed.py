"""Packed linear layers for the CPU: the model's matrix products through oneDNN with each weight
laid out once, at load, in the blocked order its kernels read.

Owns `PackedLinear` (an `nn.Linear` whose weight is a oneDNN tensor) and `pack_linears` (swap
every linear of a model for one, in place). Does not own the model (`llama.py`, whose plain
`nn.Linear` path stays the reference: `tests/test_packed.py` compares the two).

Why: on a CPU, `nn.Linear` in fp32 calls the BLAS PyTorch was built with (MKL), which takes the
weight as it lies in memory and repacks panels of it on every call; oneDNN can pack a weight once
and then stream it in the order its AVX-512 kernels consume. One product of a 2048 x 5632 weight,
CPU time on one thread of this 2-core AMD EPYC: fp32 at 1 / 16 / 64 tokens 2.1 / 6.9 / 17.6 ms
plain, 1.7 / 2.6 / 7.3 ms packed; bf16 1.2 / 1.8 / 4.2 ms plain, 0.5 / 1.2 / 3.6 ms packed. A
small product pays a fixed cost instead (256 x 704 at one token in fp32: 10 us plain, 19
packed). `minivtc bench peer --minivtc-plain` measures the whole engine both ways. The results differ
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

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        if linear.bias is not None:
            raise ValueError("PackedLinear: Llama's linear layers have no bias")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # the layout oneDNN's kernels read, made once (what torch.compile's freezing makes too)
        packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.register_buffer("weight", packed, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = torch.ops.mkldnn._linear_pointwise(x, self.weight, None, "none", [], "")
        return out


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
