"""What a caller may ask (`SamplingParams`) and the stop rules every generation path shares
(`params.py`): validation with messages, when a generation ends, what text may be shown before
it does. Plain Python: the module imports no torch, which a fresh interpreter checks."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from minivtc.requests.params import (
    DEFAULT_MAX_TOKENS,
    MAX_SEED,
    SamplingParams,
    context_error,
    releasable,
    resolve_max_tokens,
    stop_reason,
    trim_stop,
)

EOS = 2


def test_defaults_are_valid_and_sample():
    params = SamplingParams()
    assert not params.greedy and params.max_tokens == 16 and params.stop == ()
    assert SamplingParams(temperature=0).greedy


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("temperature", -0.1, "temperature must be >= 0"),
        ("top_p", 0.0, r"top_p must be in \(0, 1\]"),
        ("top_p", 1.5, r"top_p must be in \(0, 1\]"),
        ("top_k", -2, "top_k must be -1 \\(off\\), 0 \\(off\\) or more"),
        ("top_k", 2.0, "top_k must be an int"),
        ("max_tokens", "5", "max_tokens must be an int"),
        ("temperature", "hot", "temperature must be a number"),
        ("ignore_eos", 1, "ignore_eos must be True or False"),
        ("stop_token_ids", [2, -1], "stop_token_ids must be token ids"),
        ("n", 0, "n must be >= 1"),
        ("min_p", 1.5, r"min_p must be in \[0, 1\]"),
        ("presence_penalty", 3, r"presence_penalty must be in \[-2, 2\]"),
        ("repetition_penalty", 0, "repetition_penalty > 0"),
        ("logprobs", 21, r"logprobs must be in \[0, 20\]"),
        ("max_tokens", 0, "max_tokens must be >= 1"),
        ("stop", ["ok", ""], "stop sequences must be non-empty"),
        ("stop", "", "stop sequences must be non-empty"),
        ("seed", -1, r"seed must be in \[0, 2\*\*63 - 1\], got -1"),
        ("seed", 2**63, r"seed must be in \[0, 2\*\*63 - 1\]"),
    ],
)
def test_each_invalid_field_is_refused_by_name(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value})


def test_a_nan_temperature_is_refused():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=float("nan"))


def test_the_whole_seed_range_is_accepted_and_seeds_a_generator():
    """vLLM's range, 0 .. 2**63 - 1: what torch.Generator.manual_seed takes."""
    for seed in (0, 1, MAX_SEED):
        gen = SamplingParams(seed=seed).generator()
        again = SamplingParams(seed=seed).generator()
        assert gen.initial_seed() == seed and gen.get_state().equal(again.get_state())
    assert MAX_SEED == 2**63 - 1
    assert SamplingParams(temperature=0, seed=5).generator() is None  # greedy: nothing random


def test_stop_is_a_tuple_whatever_it_was_given_as_and_params_are_frozen():
    assert SamplingParams(stop="\n").stop == ("\n",)
    assert SamplingParams(stop=["a", "b"]) == SamplingParams(stop=("a", "b"))
    params = SamplingParams(stop=["a"])
    hash(params)  # frozen with tuple fields: usable as a key
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.max_tokens = 3


@pytest.mark.parametrize(
    "token, n, text, params, expect",
    [
        (EOS, 1, "", SamplingParams(), "eos"),
        (EOS, 1, "", SamplingParams(ignore_eos=True), None),
        (EOS, 4, "", SamplingParams(ignore_eos=True, max_tokens=4), "length"),
        (7, 3, "a.b", SamplingParams(stop="."), "stop"),
        (7, 3, "a.b", SamplingParams(stop=["x", "."]), "stop"),
        (7, 3, "a,b", SamplingParams(stop="."), None),
        (7, 4, "abcd", SamplingParams(max_tokens=4), "length"),
        (7, 3, "abc", SamplingParams(max_tokens=4), None),
        # More than one reason: EOS first, then a stop sequence, then the length.
        (EOS, 4, "a.", SamplingParams(stop=".", max_tokens=4), "eos"),
        (7, 4, "a.", SamplingParams(stop=".", max_tokens=4), "stop"),
    ],
)
def test_stop_reason(token, n, text, params, expect):
    assert stop_reason(token, n, text, params, EOS) == expect


@pytest.mark.parametrize(
    "text, stop, expect",
    [
        ("hello. world\n", (".", "\n"), "hello"),  # the earliest, not the first listed
        ("hello world\n.", (".", "\n"), "hello world"),
        ("no stop here", (".",), "no stop here"),
        (".starts", (".",), ""),
        ("a##b", ("##", "#"), "a"),
        ("anything", (), "anything"),
    ],
)
def test_trim_stop_cuts_at_the_earliest_stop_sequence(text, stop, expect):
    assert trim_stop(text, stop) == expect


alphabet = st.text("ab.\n", max_size=12)


@given(alphabet, alphabet, st.lists(st.text("ab.\n", min_size=1, max_size=4), max_size=3))
def test_released_text_is_never_taken_back(text, more, stop):
    """What `releasable` lets a stream show of an unfinished text is a prefix of the final text,
    however the generation goes on and wherever a stop sequence then cuts it."""
    stop = tuple(stop)
    assume(not any(s in text for s in stop))  # else the generation would have stopped already
    shown = text[: max(releasable(text, stop, finished=False), 0)]
    final = trim_stop(text + more, stop)
    assert final.startswith(shown)
    assert releasable(text, stop, finished=True) == len(text)
    assert releasable(text, (), finished=False) == len(text)  # no stop: nothing held back


def test_context_error_only_when_prompt_and_max_tokens_overflow():
    assert context_error(100, 28, 128) is None  # fits exactly
    assert context_error(100, 29, 128) == (
        "prompt (100 tokens) + max_tokens (29) = 129 exceeds the model's context of 128 positions"
    )


def test_max_tokens_none_is_the_room_left_or_a_completions_default():
    """A number is kept; None is the room the context leaves, at least one (a prompt that
    leaves none is the context check's to refuse); with no room (a completion), OpenAI's
    default, which is also `SamplingParams`'. `with_max_tokens` applies the same rule."""
    assert resolve_max_tokens(7, 100) == 7 and resolve_max_tokens(7, None) == 7
    assert resolve_max_tokens(None, 100) == 100
    assert resolve_max_tokens(None, 0) == resolve_max_tokens(None, -3) == 1
    assert resolve_max_tokens(None, None) == DEFAULT_MAX_TOKENS == SamplingParams().max_tokens
    for room in (-3, 0, 1, 100):
        resolved = SamplingParams(max_tokens=None).with_max_tokens(room)
        assert resolved.limit == resolve_max_tokens(None, room)
    assert SamplingParams(max_tokens=5).with_max_tokens(100).limit == 5


def defaults_given_in_place(tree: ast.AST) -> list[int]:
    """Lines that give a max_tokens its default where they stand: `x.max_tokens or DEFAULT`,
    or `... if <a max_tokens> is None else ...`. Not defaults: `a or b` between two of the
    body's fields (a chat's `max_completion_tokens or max_tokens` picks one), or a text for
    none (`max_tokens or ""`, a CSV's empty cell)."""

    def is_max_tokens(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id.endswith("max_tokens")) or (
            isinstance(node, ast.Attribute) and node.attr.endswith("max_tokens")
        )

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            *first, last = node.values
            text = isinstance(last, ast.Constant) and isinstance(last.value, str)
            if any(map(is_max_tokens, first)) and not is_max_tokens(last) and not text:
                lines.append(node.lineno)
        if isinstance(node, ast.IfExp) and isinstance(node.test, ast.Compare):
            compared = [node.test.left, *node.test.comparators]
            none = any(isinstance(c, ast.Constant) and c.value is None for c in compared)
            if none and any(map(is_max_tokens, compared)):
                lines.append(node.lineno)
    return lines


def test_max_tokens_none_is_resolved_in_one_place():
    """Every front door (the engine's intake, the server's routes, the gateway's, `minivtc
    generate`) resolves max_tokens with `resolve_max_tokens`: no module gives it a default of
    its own, where two could come to disagree for the same request."""
    package = Path(__file__).resolve().parents[1] / "minivtc"
    assert defaults_given_in_place(ast.parse("n = body.max_tokens or 16")) == [1]
    found = {
        f"{path.relative_to(package)}:{line}"
        for path in sorted(package.rglob("*.py"))
        if path.name != "params.py"
        for line in defaults_given_in_place(ast.parse(path.read_text()))
    }
    assert not found, f"max_tokens given a default outside `params.resolve_max_tokens`: {found}"


def test_importing_params_imports_no_torch():
    """The scheduler, the simulator and the server's schemas import this module: it must stay
    torch-free, greedy params included."""
    script = textwrap.dedent("""
        import sys
        from minivtc.requests.params import SamplingParams, stop_reason
        params = SamplingParams(temperature=0, stop=".", max_tokens=3)
        assert params.generator() is None and stop_reason(5, 3, "ab", params, 2) == "length"
        assert "torch" not in sys.modules, "importing minivtc.requests.params imported torch"
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
