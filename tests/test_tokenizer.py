"""Tokenizer: round trips, streaming that joins to the full decode, the Llama-2 chat format."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivtc.model.tokenizer import Tokenizer
from minivtc.model.weights import BUNDLED_WEIGHTS

TEXTS = [
    "Hello, world!",
    "  leading spaces,   runs of   spaces\tand\ttabs\n\nand blank lines  ",
    "Accented: café, naïve, Ångström, señor",
    "CJK: 漢字かなカナ한국어",
    "Emoji: 🙂🚀 👩‍💻 and flags 🇫🇷",
    "def f(x):\n    return x ** 2  # digits 1234567890",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer(BUNDLED_WEIGHTS / "tokenizer.model")


def test_llama_conventions(tok):
    assert (tok.sp.unk_id(), tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.encode("x")[0] == tok.bos_id
    assert tok.encode("x", bos=False)[0] != tok.bos_id


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def stream(tok, prompt_ids, generated):
    detok = tok.detokenizer(prompt_ids)
    pieces = [detok.add(t) for t in generated]
    pieces.append(detok.flush())
    return "".join(pieces), detok


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_pieces_join_to_full_decode(tok, text):
    ids = tok.encode(text, bos=False)
    joined, _ = stream(tok, [], ids)
    assert joined == tok.decode(ids) == text


@pytest.mark.parametrize("text", TEXTS)
def test_streaming_after_a_prompt_keeps_the_separating_space(tok, text):
    prompt = tok.encode("The answer is")
    generated = tok.encode(" " + text, bos=False)
    joined, detok = stream(tok, prompt, generated)
    assert joined == detok.full_text()
    assert tok.decode(prompt + generated) == "The answer is" + joined


def test_no_replacement_chars_mid_character(tok):
    """Byte-fallback tokens of an emoji yield nothing until the character is complete."""
    ids = tok.encode("🚀", bos=False)
    assert len(ids) > 1, "the emoji should need byte fallback in a 4096-token vocabulary"
    detok = tok.detokenizer([])
    deltas = [detok.add(t) for t in ids]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == "🚀"


@settings(max_examples=60, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_streaming_property(tok, text):
    ids = tok.encode(text, bos=False)
    joined, _ = stream(tok, tok.encode("Prompt:"), ids)
    assert joined == tok.decode(tok.encode("Prompt:") + ids)[len("Prompt:") :]


def test_chat_format(tok):
    ids = tok.chat_ids(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "What is a list?"},
        ]
    )
    assert ids.count(tok.bos_id) == 2 and ids.count(tok.eos_id) == 1
    # Each turn is encoded on its own (Meta's reference does the same), so the second turn's
    # SentencePiece dummy prefix decodes as a second space after "Hello. ".
    assert tok.decode(ids) == (
        "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello.  [INST] What is a list? [/INST]"
    )
    assert ids[ids.index(tok.eos_id) + 1] == tok.bos_id


@pytest.mark.parametrize(
    "messages,message",
    [
        ([], "last message must be from the user"),
        ([{"role": "assistant", "content": "x"}], "last message must be from the user"),
        ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "alternate"),
        ([{"role": "system", "content": "s"}], "followed by a user message"),
        ([{"role": "user", "content": 3}], "string 'content'"),
    ],
)
def test_chat_errors(tok, messages, message):
    with pytest.raises(ValueError, match=message):
        tok.chat_ids(messages)
