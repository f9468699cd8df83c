"""Chat messages as OpenAI and vLLM clients send them, turned into one prompt's token ids.

Owns `normalize` (what current clients send, reduced to what Llama-2's template reads: content
as a list of text parts joined into one string, the `developer` role read as `system`) and
`prompt_ids`: the Llama-2 chat format (`llama2_ids`), or a Jinja chat template as
Hugging Face writes them (`tokenizer_config.json`'s `chat_template`, vLLM's `--chat-template`):
rendered with `messages`, `bos_token`, `eos_token` and `add_generation_prompt`, then tokenized
with "<s>" and "</s>" read as BOS and EOS (the template writes them). Images, audio and tool
calls are not supported (a Llama-2 engine): a part of another type is refused by name. Lesson 9.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Protocol

from jinja2 import TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["encode_with_specials", "llama2_ids", "load_template", "prompt_ids"]

# Llama-2 chat format (Meta's reference code, generation.py).
B_INST, E_INST = "[INST]", "[/INST]"
B_SYS, E_SYS = "<<SYS>>\n", "\n<</SYS>>\n\n"


class Tokenizer(Protocol):
    """What the chat formats need of `tokenizer.Tokenizer` (which imports this module)."""

    bos_id: int
    eos_id: int
    sp: Any  # the SentencePiece processor: its pieces name the special tokens

    def encode(self, text: str, bos: bool = True) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# A chat template's render stops past these (a template is code: it could loop or grow for ever)
MAX_RENDER_S = 2.0
MAX_RENDER_CHARS = 10_000_000


def normalize(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Each message as {"role", "content": str}; ValueError names the first one it cannot read."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ValueError(f"messages[{i}] needs a role, one of {sorted(ROLES)}, got {m!r}")
        extra = set(m) - {"role", "content", "name"}
        if extra:
            raise ValueError(f"messages[{i}] has {sorted(extra)}: not supported (no tool calls)")
        out.append({"role": ROLES[m["role"]], "content": content_text(m.get("content"), i)})
    return out


def content_text(content: Any, i: int) -> str:
    """A string, or OpenAI's list of parts, of which only {"type": "text", "text": ...}."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"messages[{i}].content must be a string or a list of text parts")
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ValueError(f"messages[{i}].content: a {kind!r} part is not supported (text only)")
        if not isinstance(part.get("text"), str):
            raise ValueError(f"messages[{i}].content: a text part needs a string 'text'")
        texts.append(part["text"])
    return "".join(texts)


def prompt_ids(
    tokenizer: Tokenizer,
    messages: list[dict[str, Any]],
    chat_template: str | None = None,
    add_generation_prompt: bool = True,
    max_chars: int = MAX_RENDER_CHARS,
) -> list[int]:
    """The prompt of a conversation: Llama-2's format, or `chat_template` (the template's
    text, never a path: only `load_template` reads files, for the operator). A rendering over
    `max_chars` characters (a server passes what one request may hold) or `MAX_RENDER_S`
    seconds is refused before any of it is tokenized."""
    messages = normalize(messages)
    if chat_template is None:
        if not add_generation_prompt:
            raise ValueError("Llama-2's chat format always ends in a generation prompt")
        return llama2_ids(tokenizer, messages)
    text = render(chat_template, messages, tokenizer, add_generation_prompt, max_chars)
    return encode_with_specials(tokenizer, text)


def llama2_ids(tokenizer: Tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a Llama-2 chat prompt from OpenAI-style messages.

    `[{"role": "system"|"user"|"assistant", "content": ...}, ...]`: an optional system message
    first, then user and assistant turns alternating, ending with a user turn. Each finished
    exchange is `<s>[INST] user [/INST] answer </s>`; the system prompt is folded into the
    first user turn between <<SYS>> markers.
    """
    messages = list(messages)
    for m in messages:
        if set(m) - {"role", "content", "name"} or not isinstance(m.get("content"), str):
            raise ValueError(f"each message needs a string 'content' and a 'role', got {m!r}")
    if messages and messages[0]["role"] == "system":
        system = messages.pop(0)["content"]
        if not messages:
            raise ValueError("a system message must be followed by a user message")
        first = messages[0]
        messages[0] = {**first, "content": B_SYS + system.strip() + E_SYS + first["content"]}
    roles = [m["role"] for m in messages]
    if not roles or roles[-1] != "user":
        raise ValueError("the last message must be from the user")
    expected = ["user" if i % 2 == 0 else "assistant" for i in range(len(roles))]
    if roles != expected:
        raise ValueError(f"roles must alternate user/assistant (after one system), got {roles}")
    ids: list[int] = []
    for user, answer in zip(messages[::2], messages[1::2], strict=False):
        text = f"{B_INST} {user['content'].strip()} {E_INST} {answer['content'].strip()} "
        ids += tokenizer.encode(text) + [tokenizer.eos_id]
    last = messages[-1]["content"].strip()
    return ids + tokenizer.encode(f"{B_INST} {last} {E_INST}")


def encode_with_specials(tokenizer: Tokenizer, text: str) -> list[int]:
    """A rendered template's ids: "<s>" and "</s>" in it are BOS and EOS (as a Hugging Face
    tokenizer reads them), the text between them is encoded with no BOS of its own."""
    specials = {tokenizer.sp.id_to_piece(t): t for t in (tokenizer.bos_id, tokenizer.eos_id)}
    ids: list[int] = []
    for chunk in re.split(f"({'|'.join(map(re.escape, specials))})", text):
        if chunk in specials:
            ids.append(specials[chunk])
        elif chunk:
            ids += tokenizer.encode(chunk, bos=False)
    return ids


def load_template(chat_template: str) -> str:
    """vLLM's `--chat-template`: a file's path, else the template itself; ValueError if it
    is not a Jinja template (so a server refuses it at start, not at its first chat)."""
    text = chat_template
    if "{" not in chat_template and Path(chat_template).is_file():
        text = Path(chat_template).read_text()
    try:
        ImmutableSandboxedEnvironment().parse(text)
    except TemplateSyntaxError as e:
        raise ValueError(f"the chat template is not valid Jinja: {e}") from None
    return text


def render(
    template: str,
    messages: list[dict[str, str]],
    tokenizer: Tokenizer,
    gen: bool,
    max_chars: int = MAX_RENDER_CHARS,
) -> str:
    """Render a Hugging Face chat template, sandboxed as `transformers` does (a template is
    data from whoever wrote it: no attribute access beyond the sandbox's), and capped
    (`Capped`): at most `max_chars` characters and `MAX_RENDER_S` seconds. Every failure is a
    ValueError (a server's 400), whatever the template raised."""

    def raise_exception(message: str) -> None:
        raise ValueError(f"the chat template refused the messages: {message}")

    env = Capped(max_chars)
    env.globals["raise_exception"] = raise_exception
    try:
        parts, size = [], 0
        for part in env.from_string(template).generate(
            messages=messages,
            bos_token=tokenizer.sp.id_to_piece(tokenizer.bos_id),
            eos_token=tokenizer.sp.id_to_piece(tokenizer.eos_id),
            add_generation_prompt=gen,
        ):
            size += len(part)
            env.check(size)
            parts.append(part)
        return "".join(parts)
    except ValueError:
        raise
    except TemplateSyntaxError as e:
        raise ValueError(f"the chat template is not valid Jinja: {e}") from None
    except Exception as e:  # the sandbox's refusals, {% include %}, range(10**9), ...
        raise ValueError(f"the chat template failed on these messages: {e!r}") from None


class Capped(ImmutableSandboxedEnvironment):
    """A sandboxed Jinja environment whose renders stop at a size and a deadline: every call
    (`range` included, so every nested loop), every `*`, `**` and `+`, and every piece of
    output checks them, and a call or an operation that would make a value over the size is
    refused before it is made (`'x' * 10**8`, `10**10**10`, `'x'.ljust(10**8)`)."""

    intercepted_binops = frozenset({"*", "**", "+"})

    def __init__(self, max_chars: int) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True)
        self.max_chars, self.deadline = max_chars, time.monotonic() + MAX_RENDER_S

    def check(self, size: int = 0) -> None:
        if size > self.max_chars:
            raise ValueError(f"the chat template rendered more than {self.max_chars} characters")
        if time.monotonic() > self.deadline:
            raise ValueError(f"the chat template took more than {MAX_RENDER_S:g} s")

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        big = max((a for a in args if type(a) is int), default=0)
        if big > __self.max_chars:  # range(10**9), 'x'.ljust(10**8), ...: refused unmade
            raise ValueError(
                f"the chat template called a function with {big}: over the {__self.max_chars} "
                "characters a render may make"
            )
        __self.check()
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        self.check()
        if operator == "**" and type(right) is int and right > 64:
            raise ValueError(f"the chat template raised a number to the power {right}")
        if operator == "*":
            sizes = [len(x) for x in (left, right) if isinstance(x, (str, list, tuple))]
            counts = [x for x in (left, right) if type(x) is int]
            if sizes and counts:
                self.check(sizes[0] * counts[0])
        out = super().call_binop(context, operator, left, right)
        if isinstance(out, (str, list, tuple)):
            self.check(len(out))
        return out
