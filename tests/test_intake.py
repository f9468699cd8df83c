"""The checks before a request is queued (`engine/intake.py`): the context-length check,
written once, for a request (prompt + max_tokens) and for a prompt alone (the server's
`/tokenize`), with the messages and the blamed field each front door shows."""

import random

import pytest

from minivtc.engine.intake import RequestRejected, check_context, max_model_len
from minivtc.engine.kv_pool import BlockAllocator
from minivtc.requests.params import context_error


def refusal(*args, **kwargs) -> RequestRejected | None:
    try:
        check_context(*args, **kwargs)
    except RequestRejected as e:
        return e
    return None


def test_a_prompt_alone_may_hold_max_model_len_tokens():
    assert refusal(100, 100) is None
    e = refusal(101, 100)
    assert e is not None and e.param == "prompt" and e.kind == "invalid"
    assert e.reason == "the prompt is 101 tokens: one request may hold 100"


def test_a_request_fits_the_context_and_then_the_pool():
    """Against the rule in its first words: prompt + max_tokens within the model's context
    (`context_error`), and its blocks within the pool's; the prompt is blamed when it alone
    leaves no room for one output token."""
    rng = random.Random(0)
    for _ in range(2000):
        pool = BlockAllocator(rng.randint(1, 12), rng.randint(1, 8))
        positions = rng.randint(1, 80)
        longest = max_model_len(positions, pool)
        n, m = rng.randint(1, 90), rng.randint(1, 90)
        e = refusal(n, longest, m, positions)
        param = "prompt" if n >= longest else "max_tokens"
        if error := context_error(n, m, positions):
            assert e is not None and (e.reason, e.param) == (error, param)
        elif pool.blocks_needed(n + m) > pool.num_blocks:
            assert e is not None and e.param == param
            assert e.reason == (
                f"prompt + max_tokens = {n + m} tokens can never fit in the KV pool of "
                f"{pool.num_tokens} tokens"
            )
        else:
            assert e is None, (n, m, positions, pool.num_tokens)


@pytest.mark.parametrize("n", [3000, 2049])
def test_the_server_refuses_a_long_tokenized_prompt_with_the_engines_check(n):
    """`/tokenize`'s 400 comes from the engine's check: the same words, the field named."""
    from minivtc.serving.openai_api import APIError
    from minivtc.serving.prompts import PromptLimits, check_tokens

    limits = PromptLimits(tokens=2048, max_chars=1 << 20, exchange_tokens=8, max_messages=500)
    check_tokens(limits, 2048, "prompt")
    with pytest.raises(APIError) as raised:
        check_tokens(limits, n, "messages")
    e = raised.value
    assert (e.status, e.param, e.code) == (400, "messages", "context_length_exceeded")
    assert e.message == f"the prompt is {n} tokens: one request may hold 2048"
