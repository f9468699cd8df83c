"""Train the bundled tiny Llama-2 and its tokenizer from the Python documentation's prose.

The reproducible recipe behind `weights/` (see weights/README.md for the numbers it gave):

    apt-get install python3.11-doc          # the corpus: reST sources, PSF license
    pip install -e '.[dev]'
    python weights/train.py --out weights/   # ~25 minutes on 2 CPU cores

The recipe is fixed by step count, not wall time, and seeded, so it reproduces up to the
floating-point non-determinism of multithreaded CPU kernels. CI does not retrain.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from pathlib import Path

import sentencepiece as spm
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from minivtc.model.config import preset
from minivtc.model.llama import CausalSequences, Llama

DOC_SOURCES = Path("/usr/share/doc/python3.11/html/_sources")
VOCAB_SIZE = 4096


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("weights"))
    parser.add_argument("--sources", type=Path, default=DOC_SOURCES)
    parser.add_argument("--work", type=Path, default=Path("build/train"), help="scratch folder")
    parser.add_argument("--steps", type=int, default=700)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    if not args.sources.is_dir():
        raise SystemExit(
            f"corpus not found at {args.sources}: run `apt-get install python3.11-doc`"
        )
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    random.seed(args.seed)

    docs = load_corpus(args.sources)
    print(f"corpus: {len(docs)} documents, {sum(map(len, docs)) / 1e6:.1f}M characters")
    sp = train_tokenizer(docs, args.work, args.out)
    train_ids, val_ids = tokenize_split(docs, sp, args.seed)
    print(f"tokens: train {len(train_ids) / 1e6:.2f}M, val {len(val_ids) / 1e6:.2f}M")
    model = Llama(preset("tiny"))
    log = train(model, train_ids, val_ids, args)
    export(model, args.out)
    (args.work / "train_log.json").write_text(json.dumps(log, indent=1))
    print(json.dumps(log[-1]))


def load_corpus(root: Path) -> list[str]:
    """Every reST source, lightly cleaned to prose: roles and directives lose their markup."""
    docs = []
    for path in sorted(root.rglob("*.rst.txt")):
        text = clean_rst(path.read_text(encoding="utf-8", errors="replace"))
        if len(text) > 200:
            docs.append(text)
    return docs


def clean_rst(text: str) -> str:
    text = re.sub(r"^\.\. _[^:]+:\s*$", "", text, flags=re.M)  # link targets
    text = re.sub(r"^[=\-~^*#+\"']{3,}\s*$", "", text, flags=re.M)  # heading underlines
    text = re.sub(r":[a-z:]+:`~?!?([^`<]*?)(?:\s*<[^>]*>)?`", r"\1", text)  # :func:`x` -> x
    text = re.sub(r"``([^`]*)``", r"\1", text)  # ``code`` -> code
    text = re.sub(r"`([^`<]*?)\s*<[^>]*>`_+", r"\1", text)  # `text <url>`_ -> text
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip() + "\n"


def train_tokenizer(docs: list[str], work: Path, out: Path) -> spm.SentencePieceProcessor:
    """BPE with Llama-2's conventions: unk=0, bos=1, eos=2, byte fallback, digits split."""
    corpus = work / "corpus.txt"
    corpus.write_text("\n".join(docs), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(work / "tokenizer"),
        model_type="bpe",
        vocab_size=VOCAB_SIZE,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        byte_fallback=True,
        split_digits=True,
        character_coverage=0.9995,
        normalization_rule_name="identity",
        add_dummy_prefix=True,
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        max_sentence_length=16384,
        num_threads=2,
        minloglevel=2,
    )
    (out / "tokenizer.model").write_bytes((work / "tokenizer.model").read_bytes())
    return spm.SentencePieceProcessor(model_file=str(out / "tokenizer.model"))


def tokenize_split(docs: list[str], sp, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Documents, each BOS + text + EOS, shuffled; 2% of documents held out for validation."""
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    n_val = max(1, len(docs) // 50)
    encode = lambda i: [sp.bos_id(), *sp.encode(docs[i]), sp.eos_id()]  # noqa: E731
    val = [t for i in order[:n_val] for t in encode(i)]
    train = [t for i in order[n_val:] for t in encode(i)]
    return torch.tensor(train), torch.tensor(val)


def train(model: Llama, train_ids, val_ids, args) -> list[dict]:
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed)
    log, start = [], time.time()
    for step in range(args.steps + 1):
        lr = lr_at(step, args.steps, args.lr)
        for group in opt.param_groups:
            group["lr"] = lr
        if step % 100 == 0 or step == args.steps:
            val = evaluate(model, val_ids, args)
            log.append({"step": step, "val_loss": val, "elapsed_s": round(time.time() - start)})
            print(
                f"step {step:5d}  val {val:.3f}  lr {lr:.2e}  {time.time() - start:.0f}s",
                flush=True,
            )
        if step == args.steps:
            break
        x, y = sample_batch(train_ids, args.batch, args.seq_len, gen)
        loss = lm_loss(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 20 == 0:
            seen = (step + 1) * args.batch * args.seq_len
            print(f"step {step:5d}  train {loss.item():.3f}  tokens {seen / 1e6:.2f}M", flush=True)
            log.append({"step": step, "train_loss": round(loss.item(), 4)})
    return log


def lr_at(step: int, steps: int, peak: float) -> float:
    warmup = steps // 20
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def sample_batch(ids: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator):
    starts = torch.randint(0, len(ids) - seq_len - 1, (batch,), generator=gen)
    x = torch.stack([ids[s : s + seq_len] for s in starts])  # (B, S)
    y = torch.stack([ids[s + 1 : s + seq_len + 1] for s in starts])  # (B, S)
    return x, y


def lm_loss(model: Llama, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    b, s = x.shape
    positions = torch.arange(s).repeat(b)  # (B*S,)
    logits = model(x.flatten(), positions, CausalSequences([s] * b))  # (B*S, V)
    return F.cross_entropy(logits, y.flatten())


@torch.no_grad()
def evaluate(model: Llama, val_ids: torch.Tensor, args) -> float:
    model.eval()
    s = args.seq_len
    n = min(16, (len(val_ids) - 1) // s)
    x = val_ids[: n * s].view(n, s)
    y = val_ids[1 : n * s + 1].view(n, s)
    loss = lm_loss(model, x, y).item()
    model.train()
    return round(loss, 4)


def export(model: Llama, out: Path) -> None:
    """Hugging Face layout, so `transformers.LlamaForCausalLM.from_pretrained` reads it too."""
    tensors = {
        f"model.{k}" if k != "lm_head.weight" else k: v.detach().contiguous()
        for k, v in model.state_dict().items()
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(model.config.to_hf(), indent=2) + "\n")


if __name__ == "__main__":
    main()
