"""What a request's body becomes before it reaches the engine: a checked body, prompt token
ids, sampling params, and the refusals that must come before any per-token work.

Owns: `PromptLimits` (how much one request may hold, and so what can be refused unread: a text
too long to fit whatever it tokenizes to, a chat with more messages than the context has room
for), parsing and validating a body (`completion_body`, `chat_body`: pure functions, which the
server and the gateway run on a worker thread when the body is large, so a large body never
stalls other streams: `off_loop_if_large`), and `sampling_params` with `max_tokens_of`. Does
not own routes (`server.py`) or the bodies' fields (`openai_api.py`). Lesson 9.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from minivtc.engine.intake import RequestRejected, check_context, check_ids
from minivtc.model.tokenizer import Tokenizer
from minivtc.requests.params import ParamError, SamplingParams, resolve_max_tokens
from minivtc.serving.openai_api import (
    MAX_N,
    APIError,
    ChatBody,
    CompletionBody,
    Sampling,
    check_roles,
    parse_json,
    validate,
)

__all__ = ["PromptLimits", "chat_body", "check_fan_out", "check_length", "check_logprob_volume"]
__all__ += ["check_message_count", "check_tokens", "completion_body", "completion_inputs"]
__all__ += ["SMALL_BODY_BYTES", "max_tokens_of", "off_loop_if_large", "sampling_params"]

T = TypeVar("T")
# A body this small is parsed and checked on the event loop (a chat that fits in it is short,
# so its validation holds the loop only briefly); a larger one on a worker thread
# (`off_loop_if_large`; what each way measured: `minivtc/bench/README.md`)
SMALL_BODY_BYTES = 4096

# The most logprob entries one response may carry (completions x tokens x (top + 1)): ~70
# bytes each in JSON, so ~5 MB
MAX_LOGPROB_ENTRIES = 65_536
CHARS_PER_TOKEN_BOUND = 4  # NFKC may compose up to ~3 code points into one; 4 is a safe margin


@dataclass(frozen=True)
class PromptLimits:
    tokens: int  # the most tokens one request may hold: min(context, pool)
    max_chars: int  # a longer text can never fit, whatever it tokenizes to
    exchange_tokens: int  # the fewest tokens the chat template spends on a user/assistant pair
    max_messages: int  # a chat with more messages can never fit

    @classmethod
    def of(cls, room: int, tokenizer: Tokenizer) -> PromptLimits:
        """For an engine (or a fleet) whose longest request holds `room` tokens
        (`Engine.max_model_len`)."""
        longest_piece = max(len(tokenizer.sp.id_to_piece(i)) for i in range(tokenizer.vocab_size))
        exchange = exchange_tokens(tokenizer)
        # n messages hold at least (n - 2) / 2 exchanges (less one system message and the last
        # user turn), so each message past two costs at least exchange / 2 tokens
        max_messages = 2 + room // (exchange // 2)
        return cls(room, room * longest_piece * CHARS_PER_TOKEN_BOUND, exchange, max_messages)


def exchange_tokens(tokenizer: Tokenizer) -> int:
    """What one more user/assistant exchange adds to a chat prompt when both are empty: the
    template's own tokens, the fewest any exchange costs."""
    turn = {"role": "user", "content": ""}
    one = tokenizer.chat_ids([turn])
    two = tokenizer.chat_ids([turn, {"role": "assistant", "content": ""}, turn])
    return len(two) - len(one)


def completion_body(raw: bytes) -> CompletionBody:
    return validate(CompletionBody, parse_json(raw))


def chat_body(limits: PromptLimits, raw: bytes) -> ChatBody:
    """The chat body, checked: the number of messages before any per-message work (80,000
    one-character messages fit in 4 MB, and validating them took the event loop 0.7 s)."""
    data = parse_json(raw)
    check_message_count(limits, data)
    body = validate(ChatBody, data)
    check_roles(body.messages)
    check_length(limits, sum(len(m.text) for m in body.messages), "messages")
    return body


def check_message_count(limits: PromptLimits, data: dict) -> None:
    """Refuse a body with more messages than one request can hold, before looking at any."""
    messages = data.get("messages")
    if isinstance(messages, list) and len(messages) > limits.max_messages:
        raise APIError(
            400,
            f"{len(messages)} messages cannot fit the {limits.tokens} tokens one request may hold "
            f"(each user/assistant exchange costs at least {limits.exchange_tokens} tokens of the "
            f"chat template): at most {limits.max_messages} messages",
            "messages",
            "context_length_exceeded",
        )


def check_tokens(limits: PromptLimits, num_tokens: int, param: str) -> None:
    """Refuse a prompt that tokenized to more than one request may hold: the engine's own
    check (`intake.check_context`), as a 400 naming `param`."""
    try:
        check_context(num_tokens, limits.tokens)
    except RequestRejected as e:
        raise APIError(400, e.reason, param, "context_length_exceeded") from None


def check_length(limits: PromptLimits, num_chars: int, param: str) -> None:
    """Refuse, before tokenizing it, a text too long to fit whatever it tokenizes to: one token
    covers at most `longest_piece` characters (after normalization)."""
    if num_chars > limits.max_chars:
        raise APIError(
            400,
            f"the text is {num_chars} characters: it cannot fit the {limits.tokens} tokens one "
            "request may hold",
            param,
            "context_length_exceeded",
        )


def completion_inputs(
    limits: PromptLimits, tokenizer: Tokenizer, body: CompletionBody
) -> tuple[list[list[int]], list[str] | None]:
    """Each prompt's token ids, every one checked (a long text refused before tokenizing it),
    and with `echo` each prompt's text, to show before its completion (token ids: their
    decode)."""
    prompts = completion_prompts(body.prompt)
    check_fan_out(len(prompts) * body.n)
    ids = []
    for p in prompts:
        if isinstance(p, list):
            try:  # the engine's own check (`intake.check_ids`), before anything is queued
                check_ids(p, tokenizer.vocab_size)
            except RequestRejected as e:
                raise APIError(400, e.reason, e.param) from None
            ids.append(p)
        else:
            check_length(limits, len(p), "prompt")
            ids.append(tokenizer.encode(p))
    if not body.echo:
        return ids, None
    return ids, [p if isinstance(p, str) else tokenizer.decode(p) for p in prompts]


def completion_prompts(prompt) -> list[str | list[int]]:
    """OpenAI's prompt forms as a list of prompts: a string, token ids, or a list of either."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    return list(prompt) if prompt else [prompt]


def check_logprob_volume(count: int, max_tokens: int, top_logprobs: int | None) -> None:
    """Refuse a request whose logprobs could not be sent in a reasonable response: `count`
    completions of up to `max_tokens` tokens, each with its `top_logprobs` alternatives (a
    155-byte body asked for 17.8 MB: 16 x 768 tokens x 21 entries)."""
    if top_logprobs is None:
        return
    entries = count * max_tokens * (top_logprobs + 1)
    if entries > MAX_LOGPROB_ENTRIES:
        raise APIError(
            400,
            f"{count} completions x {max_tokens} tokens x {top_logprobs + 1} logprobs = "
            f"{entries} entries: at most {MAX_LOGPROB_ENTRIES} (ask for fewer of one of them)",
            "top_logprobs",
        )


def check_fan_out(count: int) -> None:
    if count > MAX_N:
        raise APIError(400, f"{count} completions in one request: at most {MAX_N}", "n")


def max_tokens_of(body: CompletionBody | ChatBody, room: int | None = None) -> int:
    """The body's max_tokens, resolved by the engine's rule (`params.resolve_max_tokens`): a
    chat's `max_completion_tokens` (OpenAI's newer name) before its `max_tokens`, else `room`,
    what the context leaves after its prompt (vLLM's); a completion's `max_tokens`, else
    OpenAI's default, whatever the room. The server's routes and the gateway's call it."""
    if isinstance(body, ChatBody):
        assert room is not None, "a chat without max_tokens is given the room its prompt leaves"
        return resolve_max_tokens(body.max_completion_tokens or body.max_tokens, room)
    return resolve_max_tokens(body.max_tokens, None)


def sampling_params(body: Sampling, max_tokens: int, logprobs: int | None) -> SamplingParams:
    """The body's sampling fields as `SamplingParams` (vLLM's meanings), with `max_tokens`
    resolved (`max_tokens_of`); a value they refuse (`params.check_ranges`) is a 400 naming
    it."""
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if any(not s for s in stop):
        raise APIError(400, "stop sequences must be non-empty strings", "stop")
    fields: tuple[str, ...] = ("temperature", "top_p", "top_k", "min_p", "seed", "ignore_eos", "n")
    fields += ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens")
    fields += ("skip_special_tokens", "include_stop_str_in_output")
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            stop=stop,
            stop_token_ids=tuple(body.stop_token_ids or ()),
            logprobs=logprobs,
            **{name: getattr(body, name) for name in fields},
        )
    except ParamError as e:
        raise APIError(400, str(e), e.param) from None


async def off_loop_if_large(size: int, work: Callable[..., T], *args) -> T:
    """`work(*args)` for a body of `size` bytes: on a worker thread if the body is large, so a
    10,000-message chat or a 4 MB prompt never stalls the other streams; on the event loop if
    it is small, as nearly every body is, where the work is a fraction of what two hand-offs
    between threads cost (and a worker woken per request takes a core from the engine)."""
    if size > SMALL_BODY_BYTES:
        return await asyncio.to_thread(work, *args)
    return work(*args)
