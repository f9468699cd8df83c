"""The model's forward pass as one compiled graph, attention left as it is: the CPU's fast path.

Owns `compile_model` (a model whose `forward` runs through `torch.compile`, inductor's
freezing packing its weights) and the one operator that keeps attention out of the graph.
Does not own: attention (`attention.py`, which the graph calls once per layer, unchanged) or
the plain path (`llama.py`, which stays the reference: `tests/test_compiled.py` compares the
two). No lesson teaches it: the lessons read the plain path.

Why: at the bundled model's size a decode step is mostly small elementwise operators (the
norms, the rotation, the SwiGLU product, the residual sums) that each pay a fixed dispatch cost
whatever their size. Compiled, they fuse into a few loops, and inductor's freezing
packs the linear layers' weights once for the CPU's matrix kernels, as `packed.py` does
(measured: `minivtc/bench/README.md`, "The whole forward pass compiled"). Compiling each layer
does not pay: around attention each layer becomes four compiled frames, whose guards and calls
cost more than the fusion saves. So attention is one opaque operator (`minivtc::step_attention`)
and the whole forward is one graph (`fullgraph`: a graph break is an error, not a slow path):
the paged attention (its gather, mask and SDPA) runs eagerly inside it, a request's keys and
values are written as before, and the graph's shapes depend only on the step's counts of tokens
and of logit rows, not on its groups or block tables.

Where it runs: `minivtc serve` on a CPU in fp32 or bf16 (where `packed.py` would pack), unless
`--enforce-eager`, and `bench serve` / `bench peer --minivtc-modes compiled`. The house's habit
is that a compiled path defaults off on a CPU; the server departs from it because `vllm serve`
compiles by default and a user who starts the server expects its speed. Everything else (the
lessons, the tests of the model, `LLM(...)`, whose `enforce_eager` only governs compiled
attention) runs the eager path.

Three departures from the house's rules, each because a compiled graph needs it: the step's
`PagedAttention` is a Python object and a graph carries only tensors, so it reaches the operator
through a context variable set for the one call that uses it; inductor's `freezing` is a
process-wide switch, turned on for the process; and the model's `forward` is replaced on the
instance (the runner calls the model as before).

Costs and limits: each of the few shapes a server meets is compiled once, on its first call (one
token; one row of logits; many: `engine/factory.compile_shapes` runs them at a server's start;
how long: the bench README); the
linear layers' weights are held twice (as loaded, and packed); the weights are constants of the
graph, so changing them afterwards changes nothing; inference only. The results differ from the
plain path by float rounding only (inductor fuses and reorders).

Shape legend: T tokens in the flat batch, H query heads, K key/value heads, D head dim, N logit
rows, V vocabulary.
"""

from __future__ import annotations

from contextvars import ContextVar

import torch
from torch import Tensor, nn

from minivtc.model.llama import Attention, Llama
from minivtc.model.packed import fuse_linears

__all__ = ["CompiledForward", "compile_model"]

# The attention of the forward call in progress (one per thread or task: a ContextVar).
STEP_ATTENTION: ContextVar[Attention | None] = ContextVar("minivtc_step_attention", default=None)


@torch.library.custom_op("minivtc::step_attention", mutates_args=())
def step_attention(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The running step's attention for `layer`: q (T, H, D), k and v (T, K, D) -> (T, H, D).
    Opaque to the compiler (it writes the KV pool, which the graph never sees)."""
    attention = STEP_ATTENTION.get()
    if attention is None:
        raise RuntimeError(
            "minivtc::step_attention runs only inside a compiled model's forward call "
            "(compiled.CompiledForward), which says whose attention it is"
        )
    return attention(layer, q, k, v)


@step_attention.register_fake
def _(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return torch.empty_like(q)  # (T, H, D): what the compiler needs to know of the result


def opaque_attention(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The `Attention` the compiled graph is traced with: one operator call per layer."""
    out: Tensor = torch.ops.minivtc.step_attention(layer, q, k, v)
    return out


class CompiledForward:
    """`Llama.forward` of one model, compiled once with attention as `step_attention`."""

    def __init__(self, model: Llama) -> None:
        self.model = model
        # the rotary table made now: made inside the first traced call, it would compile again
        weight = model.embed_tokens.weight
        model.rotary_tables(torch.zeros(1, dtype=torch.long, device=weight.device), weight.dtype)
        # freezing (the weights as constants, packed once) is inductor's process-wide switch,
        # read whenever a new shape compiles: a patch around each call would cost more than a
        # small step can spare (bench README). Any other inference-only compile in the process
        # takes it as well. dynamic: one graph for every token count after the first few
        # shapes, not one per step.
        torch._inductor.config.freezing = True
        self.graph = torch.compile(self.traced, dynamic=True, fullgraph=True)

    def __call__(
        self, tokens: Tensor, positions: Tensor, attention: Attention, logit_rows: Tensor | None
    ) -> Tensor:
        token = STEP_ATTENTION.set(attention)
        try:
            logits: Tensor = self.graph(tokens, positions, logit_rows)  # (N, V)
        finally:
            STEP_ATTENTION.reset(token)
        return logits

    def traced(self, tokens: Tensor, positions: Tensor, logit_rows: Tensor | None) -> Tensor:
        return Llama.forward(self.model, tokens, positions, opaque_attention, logit_rows)


def compile_model(model: Llama) -> Llama:
    """Compile `model`'s forward pass in place (its linear layers fused as `packed.py` fuses
    them, left as `nn.Linear` for inductor to pack) and return it. Calls keep their signature;
    the first call of each new shape compiles (seconds). On a CPU, inference only."""
    if model.embed_tokens.weight.device.type != "cpu":
        raise ValueError("compile_model is the CPU's path (on CUDA: compile_attention)")
    if not isinstance(model.lm_head, nn.Linear) or "forward" in vars(model):
        raise ValueError("compile_model takes a model as loaded: not packed, not compiled")
    fuse_linears(model, plain_linear)
    # an instance attribute: nn.Module's __call__ runs it in place of Llama.forward
    setattr(model, "forward", CompiledForward(model))  # noqa: B010
    return model


def plain_linear(weight: Tensor) -> nn.Linear:
    """`nn.Linear(bias=False)` over `weight` (out, in), as it is (no copy)."""
    out_features, in_features = weight.shape
    layer = nn.Linear(in_features, out_features, bias=False, device="meta")
    layer.weight = nn.Parameter(weight.detach(), requires_grad=False)
    return layer
