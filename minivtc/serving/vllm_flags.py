"""`minivtc serve` as `vllm serve` is started: vLLM's flags, read as minivtc's.

Owns `add_vllm_flags` and `VLLMServe`, what they mean here:

- the model: positional `MODEL` or `--model` (minivtc's `--weights` stays), and its id, the
  `--served-model-name` (several: the first is the id, the others aliases), else the path as
  given (so a client that sends `model="<the path>"` is served), else "minivtc-tiny";
- `--api-key KEY`: vLLM's one key, for one operator: it may read `/metrics` and `/fairness`,
  and its requests name their client (`X-Client-Id` or `user`, as a trusted proxy's do), so
  fair shares still hold between the users behind it (`--api-keys FILE` stays, for tenants);
- `--max-model-len`, `--max-num-seqs` (the batch's most requests), `--enable-prefix-caching`
  (= `--prefix-caching`), `--gpu-memory-utilization` (on CUDA, sizes the KV pool from the
  device's free memory: `engine/kv_pool.pool_bytes`), `--chat-template` (a Jinja file or string);
- `--enforce-eager`: on a CPU the forward pass is compiled by default, as vLLM's is
  (`model/compiled.py`, at start, before the port opens); this flag keeps it eager
  (`model/packed.py`'s products), for a quick start;
- `--tensor-parallel-size` above 1 is refused; `--trust-remote-code`, `--disable-log-requests`
  and `--disable-log-stats` are accepted and change nothing here (nothing from a checkpoint is
  run; no request or stats logs).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from minivtc.serving.api_keys import MIN_KEY_CHARS, Key

__all__ = ["VLLMServe", "add_vllm_flags"]

DEFAULT_NAME = "minivtc-tiny"


def add_vllm_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_path", nargs="?", default=None, metavar="MODEL", help="as --model")
    p.add_argument("--model", default=None, help="Hugging Face Llama directory (as --weights)")
    p.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        metavar="NAME",
        help="the model's id in requests and /v1/models (more names: aliases); default the "
        "model path as given",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("VLLM_API_KEY"),  # (vLLM's too: a key in the environment
        metavar="KEY",  # does not show in `ps`)
        help="one key for every caller (vLLM's), at least 8 characters; default the "
        "VLLM_API_KEY environment variable, which `ps` does not show; its requests name "
        "their client with X-Client-Id or 'user'; --api-keys FILE gives tenants their own "
        "keys instead",
    )
    p.add_argument("--max-model-len", type=int, default=None, help="the most prompt + output")
    p.add_argument("--max-num-seqs", type=int, default=None, help="the most requests running")
    p.add_argument("--enable-prefix-caching", action="store_true", help="as --prefix-caching")
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        metavar="F",
        help="CUDA only: size the KV pool so this share of the device's memory is used "
        "(instead of --kv-tokens)",
    )
    p.add_argument("--chat-template", default=None, help="a Jinja chat template, file or text")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="1 only: one device")
    p.add_argument(
        "--enforce-eager",
        action="store_true",
        help="CPU: run the forward pass eagerly (packed products), not compiled at start",
    )
    p.add_argument("--trust-remote-code", action="store_true", help="accepted; changes nothing")
    for flag in ("--disable-log-requests", "--disable-log-stats"):
        p.add_argument(flag, action="store_true", help="accepted; changes nothing here")


@dataclass(frozen=True)
class VLLMServe:
    checkpoint: str | None  # None: the bundled model
    name: str
    aliases: tuple[str, ...]
    keys: dict[str, Key] | None  # from --api-key (None: not given)

    @classmethod
    def of(cls, args: argparse.Namespace) -> VLLMServe:
        given = {v for v in (args.model_path, args.model, args.weights) if v is not None}
        if len(given) > 1:
            raise ValueError(f"MODEL, --model and --weights name one checkpoint: got {given}")
        if args.tensor_parallel_size != 1:
            raise ValueError("--tensor-parallel-size: minivtc runs on one device")
        if args.api_key is not None and args.api_keys:
            raise ValueError("give --api-key (one key) or --api-keys FILE (tenants), not both")
        checkpoint = next(iter(given), None)
        names = tuple(args.served_model_name or (checkpoint or DEFAULT_NAME,))
        keys = None
        if args.api_key is not None:
            if len(args.api_key) < MIN_KEY_CHARS:
                raise ValueError(
                    f"--api-key is shorter than {MIN_KEY_CHARS} characters: too easy to guess"
                )
            keys = {args.api_key: Key("default", admin=True, proxy=True)}
        return cls(checkpoint, names[0], names[1:], keys)

    def dtype(self, args: argparse.Namespace):
        """--dtype, with "auto" and vLLM's names (`model/weights.resolve_dtype`)."""
        from pathlib import Path

        from minivtc.model.weights import bundled_weights_dir, resolve_dtype

        root = Path(self.checkpoint) if self.checkpoint else bundled_weights_dir()
        return resolve_dtype(args.dtype, root, args.device)

    def pool(self, args: argparse.Namespace, model) -> dict:
        """The KV pool: --kv-tokens, or on CUDA --gpu-memory-utilization's share of the device;
        --max-model-len caps what one request may hold."""
        from minivtc.engine.kv_pool import pool_bytes

        device = model.embed_tokens.weight.device
        pool: dict = {"max_model_len": args.max_model_len}
        if args.gpu_memory_utilization is not None and device.type == "cuda":
            if args.kv_tokens is not None:
                raise ValueError("give --kv-tokens or --gpu-memory-utilization, not both")
            return pool | {"kv_bytes": pool_bytes(args.gpu_memory_utilization, device)}
        return pool | {"kv_tokens": args.kv_tokens if args.kv_tokens is not None else 10000}
