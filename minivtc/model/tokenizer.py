"""Text <-> token ids: a SentencePiece wrapper with streaming detokenization and Llama-2 chat.

Owns: encoding (with BOS), decoding, the incremental `Detokenizer` that streams text as tokens
arrive. Does not own: the chat prompt formats (`chat.py`, which `chat_ids` and
`apply_chat_template` call), the vocabulary itself (a `tokenizer.model` file next to the
weights) or stop sequences (the engine checks those on text).
Lesson 1 teaches it.

Why streaming needs care: SentencePiece drops the leading space of the *first* piece it decodes
("▁Hello" alone decodes to "Hello"), and with byte fallback one character may span several
tokens (an emoji is four byte tokens; the first three decode to U+FFFD). Decoding each token on
its own would therefore lose spaces and print garbage. `Detokenizer` decodes a short window that
starts at a token already printed, and prints only what the new token added once the window no
longer ends in a half-finished character.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sentencepiece as spm

from minivtc.model import chat

__all__ = ["Detokenizer", "Tokenizer"]

REPLACEMENT_CHAR = "\ufffd"  # what SentencePiece prints for an incomplete UTF-8 byte sequence


class Tokenizer:
    def __init__(self, model_file: str | Path) -> None:
        path = Path(model_file)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        self.sp = spm.SentencePieceProcessor(model_file=str(path))
        self.bos_id: int = self.sp.bos_id()
        self.eos_id: int = self.sp.eos_id()
        self.vocab_size: int = self.sp.vocab_size()

    def encode(
        self, text: str, bos: bool = True, add_special_tokens: bool | None = None
    ) -> list[int]:
        """Token ids of `text`, BOS first (`add_special_tokens`: Hugging Face's name for `bos`)."""
        bos = bos if add_special_tokens is None else add_special_tokens
        ids: list[int] = self.sp.encode(text)
        return ([self.bos_id] if bos else []) + ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; BOS and EOS are control tokens and decode to nothing, or with
        `skip_special_tokens=False` to their pieces ("<s>", "</s>"), as Hugging Face's do."""
        if skip_special_tokens:
            text: str = self.sp.decode(list(ids))
            return text
        runs: list[str] = []
        run: list[int] = []
        for t in ids:
            if self.sp.is_control(t):
                runs += [self.sp.decode(run), self.sp.id_to_piece(t)]
                run = []
            else:
                run.append(t)
        tail: str = self.sp.decode(run)
        return "".join(runs) + tail

    def token_text(self, token: int) -> str:
        """One token's own text, its leading space kept (SentencePiece's "▁"), as logprobs show
        it: a generation's tokens joined spell its text. A byte token may be part of a character
        (U+FFFD alone); BOS and EOS are "<s>" and "</s>"."""
        if self.sp.is_byte(token):
            byte: str = self.sp.decode([token])
            return byte
        piece: str = self.sp.id_to_piece(token)
        return piece if self.sp.is_control(token) else piece.replace("\u2581", " ")

    # Hugging Face's names, which vLLM users reach through `LLM.get_tokenizer()`
    bos_token_id = property(lambda self: self.bos_id)
    eos_token_id = property(lambda self: self.eos_id)
    pad_token_id = None  # Llama-2 has none

    def __call__(self, text: str | list[str], add_special_tokens: bool = True) -> dict[str, Any]:
        """`{"input_ids": ..., "attention_mask": ...}` of a text or a list of texts."""
        if isinstance(text, str):
            ids = self.encode(text, add_special_tokens)
            return {"input_ids": ids, "attention_mask": [1] * len(ids)}
        batch = [self.encode(t, add_special_tokens) for t in text]
        return {"input_ids": batch, "attention_mask": [[1] * len(i) for i in batch]}

    def __len__(self) -> int:
        return self.vocab_size

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        tokenize: bool = True,
    ) -> list[int] | str:
        """The chat prompt's ids (`tokenize=True`) or text (with "<s>"/"</s>" written out)."""
        ids = chat.prompt_ids(self, conversation, chat_template, add_generation_prompt)
        return ids if tokenize else self.decode(ids, skip_special_tokens=False)

    def detokenizer(self, prompt_ids: list[int] | None = None) -> Detokenizer:
        return Detokenizer(self, list(prompt_ids or []))

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a Llama-2 chat prompt from OpenAI-style messages (`chat.llama2_ids`)."""
        return chat.llama2_ids(self, messages)


@dataclass
class Detokenizer:
    """Turns a growing list of token ids into text deltas whose concatenation is the full decode.

    `prefix_offset..read_offset` is the window already turned into text; the next delta is
    decode(ids[prefix_offset:]) minus decode(ids[prefix_offset:read_offset]). Both decodes lose
    the same leading space (if any), so their difference is exact.
    """

    tokenizer: Tokenizer
    ids: list[int]
    prefix_offset: int = field(init=False)
    read_offset: int = field(init=False)
    text: str = ""  # everything emitted so far

    def __post_init__(self) -> None:
        # Start the window at most a few tokens into the prompt, so the first generated token
        # keeps the space that separates it from the prompt.
        self.read_offset = len(self.ids)
        self.prefix_offset = max(0, len(self.ids) - 5)
        self.prompt_len = len(self.ids)

    def add(self, token_id: int) -> str:
        """Append one token; return the text it completes ("" while a character is unfinished)."""
        self.ids.append(token_id)
        window = self.ids[self.prefix_offset :]
        before = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        after = self.tokenizer.decode(window)
        if len(after) <= len(before) or after.endswith(REPLACEMENT_CHAR):
            return ""  # wait for the rest of the character (or a token that adds no text)
        delta = after[len(before) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of a stream: whatever is still held back (e.g. a truly broken character)."""
        rest = self.full_text()[len(self.text) :]
        self.text += rest
        return rest

    def text_before_last(self) -> str:
        """The generated text without the last token's (a stop token's, which is not shown)."""
        start = max(0, self.prompt_len - 5)
        head = self.tokenizer.decode(self.ids[start : self.prompt_len])
        return self.tokenizer.decode(self.ids[start:-1])[len(head) :]

    def full_text(self) -> str:
        """The generated tokens' text, decoded in one go: what all deltas joined must equal."""
        start = max(0, self.prompt_len - 5)
        head = self.tokenizer.decode(self.ids[start : self.prompt_len])
        return self.tokenizer.decode(self.ids[start:])[len(head) :]
