"""A request's generated text as it streams: each token detokenized, the held-back text
flushed at the end, the stop sequence cut.

Owns `Texts`, one detokenizer per live request (`tokenizer.Detokenizer`: SentencePiece pieces
join into text only once a whole character is there). The stop rules themselves (`stop_reason`,
`cut_stop`; `releasable`, what `StepOutput.take` may hand out) are `params.py`'s. An
engine without a tokenizer (the simulator) keeps token ids only: no text. Lesson 3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minivtc.requests.params import cut_stop
from minivtc.requests.request import Request

__all__ = ["Texts"]

if TYPE_CHECKING:
    from minivtc.model.tokenizer import Detokenizer, Tokenizer


class Texts:
    """Each live request's detokenizer, by request id: `open` at arrival, `add` per token,
    `finish` when it ends, `close` when it is gone."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self.detokenizers: dict[str, Detokenizer] = {}  # request id -> its detokenizer

    def open(self, request: Request) -> None:
        if self.tokenizer is not None:
            self.detokenizers[request.request_id] = self.tokenizer.detokenizer(request.prompt_ids)

    def add(self, request: Request, token: int) -> None:
        """`token`'s text joins the request's (none without a tokenizer)."""
        detok = self.detokenizers.get(request.request_id)
        if detok is not None:
            request.text += detok.add(token)

    def finish(self, request: Request, reason: str) -> None:
        """The request ended: flush the held-back text; a stop sequence is cut off."""
        detok = self.detokenizers.get(request.request_id)
        if detok is not None:
            request.text += detok.flush()
        if reason == "stop":  # a stop string or token: cut, or kept (vLLM's include_stop_str)
            before = detok.text_before_last() if detok else request.text
            cut = cut_stop(request.text, before, request.output_ids[-1], request.params)
            request.text, request.stop_reason = cut

    def close(self, request: Request) -> None:
        self.detokenizers.pop(request.request_id, None)
