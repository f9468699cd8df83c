"""Logprobs as OpenAI's two APIs spell them, from a request's `Logprob`s (`engine/logprobs.py`).

Owns `completion_logprobs` (the legacy completions shape: parallel lists `tokens`,
`token_logprobs`, `top_logprobs`, `text_offset`) and `chat_logprobs` (chat's: one object per
token with its `bytes` and `top_logprobs`). A token's text is `Tokenizer.token_text` (its
leading space kept), so a completion's tokens joined spell its text. Lesson 9.
"""

from __future__ import annotations

from minivtc.engine.logprobs import Logprob
from minivtc.model.tokenizer import Tokenizer

__all__ = ["chat_logprobs", "completion_logprobs"]

Entry = dict[int, Logprob]  # the chosen token first, then the top k


def piece(tokenizer: Tokenizer, token: int) -> str:
    return tokenizer.token_text(token)


def top(entry: Entry, k: int) -> list[tuple[int, Logprob]]:
    """The k likeliest of an entry (its chosen token among them only if it ranks so)."""
    return sorted(entry.items(), key=lambda item: item[1].rank)[:k]


def completion_logprobs(
    tokenizer: Tokenizer, tokens: list[int], entries: list[Entry], k: int, offset: int
) -> dict:
    """`tokens` and their entries; `offset`: characters of text before the first of them."""
    pieces = [piece(tokenizer, t) for t in tokens]
    offsets = []
    for p in pieces:
        offsets.append(offset)
        offset += len(p)
    return {
        "tokens": pieces,
        "token_logprobs": [e[t].logprob for t, e in zip(tokens, entries, strict=True)],
        "top_logprobs": [{piece(tokenizer, t): lp.logprob for t, lp in top(e, k)} for e in entries],
        "text_offset": offsets,
    }


def chat_logprobs(tokenizer: Tokenizer, tokens: list[int], entries: list[Entry], k: int) -> dict:
    def one(token: int, logprob: float) -> dict:
        text = piece(tokenizer, token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    content = [
        {**one(t, e[t].logprob), "top_logprobs": [one(u, lp.logprob) for u, lp in top(e, k)]}
        for t, e in zip(tokens, entries, strict=True)
    ]
    return {"content": content}
