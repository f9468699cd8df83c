"""The model's shape: one frozen dataclass, presets by exact name, and the Hugging Face mapping.

Owns: `LlamaConfig` (every number that decides a Llama-2 model's tensor shapes) and the two
conversions to and from a Hugging Face `config.json` dictionary. Does not own: reading files
(`weights.py`), or runtime facts such as how many KV blocks fit in memory (`kv_pool.py` returns
those). Lesson 1 teaches it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["LlamaConfig", "PRESETS", "preset"]


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 32000
    dim: int = 4096  # hidden size, the width of the residual stream
    n_layers: int = 32
    n_heads: int = 32  # query heads
    n_kv_heads: int = 32  # key/value heads; fewer than n_heads is grouped-query attention
    ffn_dim: int = 11008  # SwiGLU inner width
    max_positions: int = 4096  # the context window: largest position + 1
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"LlamaConfig.{name} must be positive, got {getattr(self, name)}")
        if self.dim % self.n_heads:
            raise ValueError(f"dim={self.dim} is not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}: "
                "grouped-query attention shares each KV head among a whole group of query heads"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def group_size(self) -> int:
        """How many query heads share one KV head (1 = plain multi-head attention)."""
        return self.n_heads // self.n_kv_heads

    @property
    def num_params(self) -> int:
        attn = self.dim * self.head_dim * (2 * self.n_heads + 2 * self.n_kv_heads)
        ffn = 3 * self.dim * self.ffn_dim
        per_layer = attn + ffn + 2 * self.dim
        return self.n_layers * per_layer + 2 * self.vocab_size * self.dim + self.dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes one token's keys and values take across all layers."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> LlamaConfig:
        """Build from a Hugging Face `config.json` dict; refuse what this engine cannot run."""
        rope_theta = refuse_unsupported(hf)
        return cls(
            vocab_size=hf["vocab_size"],
            dim=hf["hidden_size"],
            n_layers=hf["num_hidden_layers"],
            n_heads=hf["num_attention_heads"],
            n_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            ffn_dim=hf["intermediate_size"],
            max_positions=hf.get("max_position_embeddings", 4096),
            rope_theta=rope_theta,
            norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
            bos_id=hf.get("bos_token_id", 1),
            eos_id=hf.get("eos_token_id", 2),
        )

    def to_hf(self) -> dict[str, Any]:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.dim,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "intermediate_size": self.ffn_dim,
            "max_position_embeddings": self.max_positions,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.norm_eps,
            "bos_token_id": self.bos_id,
            "eos_token_id": self.eos_id,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            "rope_scaling": None,
            "torch_dtype": "float32",
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Presets by exact name. The 7B/13B shapes are the paper's main and ablation models (Llama-2-7B
# in Sections 5.2-5.3, Llama-2-13B in Section 5.4).
PRESETS: dict[str, LlamaConfig] = {
    "llama-2-7b": LlamaConfig(),
    "llama-2-13b": LlamaConfig(dim=5120, n_layers=40, n_heads=40, n_kv_heads=40, ffn_dim=13824),
    "llama-2-70b": LlamaConfig(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672),
    # A 1B-class shape for benchmarks where the kernels matter (TinyLlama-1.1B's widths, 24
    # layers, the bundled tokenizer's vocabulary): `minivtc bench checkpoint` writes random weights.
    "bench-1b": LlamaConfig(
        vocab_size=4096,
        dim=2048,
        n_layers=24,
        n_heads=32,
        n_kv_heads=4,
        ffn_dim=5632,
        max_positions=2048,
    ),
    # The bundled model's shape (weights/README.md): small enough to train on 2 CPU cores.
    "tiny": LlamaConfig(
        vocab_size=4096,
        dim=256,
        n_layers=5,
        n_heads=8,
        n_kv_heads=2,
        ffn_dim=704,
        max_positions=2048,
    ),
}


def preset(name: str) -> LlamaConfig:
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]


def refuse_unsupported(hf: dict[str, Any]) -> float:
    """Refuse a `config.json` this engine cannot run (another architecture, rope scaling,
    biases, tied embeddings, another activation); return its RoPE theta."""
    arch = hf.get("architectures") or [hf.get("model_type", "?")]
    if hf.get("model_type") != "llama" or arch[0] != "LlamaForCausalLM":
        raise ValueError(
            f"unsupported architecture {arch} (model_type={hf.get('model_type')!r}): "
            "minivtc runs Llama-2 checkpoints (LlamaForCausalLM, model_type 'llama')"
        )

    unsupported = {
        "rope_scaling": hf.get("rope_scaling"),
        "attention_bias": hf.get("attention_bias", False),
        "mlp_bias": hf.get("mlp_bias", False),
        "tie_word_embeddings": hf.get("tie_word_embeddings", False),
    }
    for key, value in unsupported.items():
        if value:
            raise ValueError(f"unsupported setting in config.json: {key}={value!r}")
    # transformers >= 5 writes {"rope_parameters": {"rope_type", "rope_theta"}}; Llama-2's own
    # config.json (and transformers 4) has a top-level "rope_theta".
    rope = hf.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"unsupported setting in config.json: rope_parameters={rope!r}")
    rope_theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    head_dim = hf.get("head_dim")
    if head_dim is not None and head_dim * hf["num_attention_heads"] != hf["hidden_size"]:
        raise ValueError(f"unsupported head_dim={head_dim}: must be hidden_size / heads")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported hidden_act {hf['hidden_act']!r}: Llama-2 uses 'silu'")
    return float(rope_theta)
