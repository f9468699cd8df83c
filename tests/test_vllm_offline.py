"""The offline API as vLLM spells it: `generate(prompts, sampling_params=..., use_tqdm=...)`,
`LLM.chat`, `get_tokenizer()` with Hugging Face's common surface, and vLLM's constructor
arguments (those that mean nothing here are a clear error)."""

from __future__ import annotations

import pytest
import torch

from minivtc.model.chat import encode_with_specials
from minivtc.model.weights import BUNDLED_WEIGHTS
from minivtc.offline.llm import LLM
from minivtc.requests.params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "A list is"}]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(model=str(BUNDLED_WEIGHTS))


def test_generate_takes_vllm_keywords(llm):
    a = llm.generate("The list", sampling_params=GREEDY, use_tqdm=False)
    b = llm.generate(["The list"], GREEDY, use_tqdm=True)
    assert a[0].token_ids == b[0].token_ids and len(a[0].token_ids) == 6
    assert llm.generate("The list", use_tqdm=False)[0].outputs[0].index == 0  # defaults
    with pytest.raises(ValueError, match="LoRA"):
        llm.generate("The list", GREEDY, lora_request=object())


def test_chat_is_generate_on_the_chat_prompt(llm):
    tok = llm.get_tokenizer()
    expect = llm.generate({"prompt_token_ids": tok.chat_ids(CHAT)}, GREEDY)[0].token_ids
    [one] = llm.chat(CHAT, GREEDY, use_tqdm=False)
    assert one.token_ids == expect and one.prompt_token_ids == tok.chat_ids(CHAT)
    parts = [
        {"role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "A list"}, {"type": "text", "text": " is"}],
        },
    ]
    both = llm.chat([CHAT, parts], GREEDY, use_tqdm=False)
    assert [o.token_ids for o in both] == [expect, expect]
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(ValueError, match="'image_url' part is not supported"):
        llm.chat(image, GREEDY)
    assert not llm.engine.requests


def test_chat_with_a_jinja_chat_template(llm, tmp_path):
    template = (
        "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    tok = llm.get_tokenizer()
    ids = tok.apply_chat_template(CHAT, chat_template=template)
    assert ids == [1] + tok.encode("<system>Be brief.<user>A list is<assistant>", bos=False)
    assert ids[0] == tok.bos_token_id  # the template's "<s>" is the BOS token
    path = tmp_path / "template.jinja"
    path.write_text(template)
    [out] = llm.chat(CHAT, GREEDY, chat_template=path.read_text(), use_tqdm=False)
    assert out.prompt_token_ids == ids
    [out] = llm.chat(CHAT, GREEDY, chat_template=str(path), use_tqdm=False)  # text: not read
    assert out.prompt_token_ids == tok.encode(str(path), bos=False)
    with pytest.raises(ValueError, match="not valid Jinja"):
        llm.chat(CHAT, GREEDY, chat_template="{% for m in messages %}")
    with pytest.raises(ValueError, match="failed on these messages"):  # the sandbox says no
        llm.chat(CHAT, GREEDY, chat_template="{{ messages.__class__.__mro__ }}")
    assert not llm.engine.requests


def test_the_tokenizer_has_hugging_faces_common_surface(llm):
    tok = llm.get_tokenizer()
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2) and len(tok) == 4096
    ids = tok.encode("A list is")
    assert ids[0] == 1 and tok.encode("A list is", add_special_tokens=False) == ids[1:]
    assert tok("A list is")["input_ids"] == ids
    assert tok(["a", "b c"])["attention_mask"] == [[1] * len(tok.encode(t)) for t in ("a", "b c")]
    assert tok.decode(ids) == "A list is"
    assert tok.decode(ids + [2], skip_special_tokens=False) == "<s>A list is</s>"
    turns = [*CHAT, {"role": "assistant", "content": "ordered."}, {"role": "user", "content": "A"}]
    text = tok.apply_chat_template(turns, tokenize=False)
    assert text.startswith("<s>[INST] <<SYS>>") and text.endswith("[/INST]")
    # the text, read back with "<s>" and "</s>" as BOS and EOS, is the prompt's ids again
    assert encode_with_specials(tok, text) == tok.apply_chat_template(turns) == tok.chat_ids(turns)


def test_vllm_constructor_arguments():
    small = LLM(
        BUNDLED_WEIGHTS,
        dtype="auto",
        max_model_len=64,
        max_num_seqs=3,
        enable_prefix_caching=True,
        gpu_memory_utilization=0.9,  # a CPU: the pool is kv_tokens (the default 10000)
        enforce_eager=True,
        trust_remote_code=True,
        swap_space=4,
        tensor_parallel_size=1,
        disable_log_stats=True,
        tokenizer=str(BUNDLED_WEIGHTS),
        seed=0,
    )
    assert small.engine.max_model_len == 64 and small.engine.config.max_running == 3
    assert small.engine.cache is not None and small.model.embed_tokens.weight.dtype == torch.float32
    with pytest.raises(ValueError, match="exceeds the model's context of 64"):
        small.generate("x", SamplingParams(max_tokens=64))


def test_a_seed_makes_a_run_reproducible():
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    runs = [LLM(seed=5).generate(["a", "b"], params, use_tqdm=False) for _ in range(2)]
    assert [o.token_ids for o in runs[0]] == [o.token_ids for o in runs[1]]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tensor_parallel_size": 2}, "runs on one device"),
        ({"pipeline_parallel_size": 2}, "runs on one device"),
        ({"quantization": "awq"}, "not supported"),
        ({"gpu_memory_utilization": 1.5}, r"must be in \(0, 1\]"),
        ({"max_model_len": 4096}, "more than the model's context"),
        ({"dtype": "float8"}, "unknown dtype"),
        ({"tokenizer": "/elsewhere"}, "reads the tokenizer.model of the model directory"),
        ({"max_num_batched_tokens": 512}, "chunked prefill is not supported"),
        ({"kv_cache_dtype": "fp8"}, "only 'auto' here"),
        ({"max_tokenz": 5}, r"LLM\(max_tokenz=...\): not a vLLM argument"),
    ],
)
def test_arguments_with_no_meaning_here_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLM(**kwargs)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "half", "float32", "bf16"])
def test_vllm_dtype_names(dtype):
    llm = LLM(dtype=dtype)
    want = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16}
    want["half"] = torch.float16
    assert llm.model.embed_tokens.weight.dtype == want.get(dtype, torch.float32)


def test_gpu_memory_utilization_sizes_the_pool_from_free_device_memory(monkeypatch):
    """vLLM's rule on CUDA (no device here: the driver's answer is stood in for): the process
    may use 90% of the device; 40 of 100 GB are in use; 5% stays for activations."""
    from minivtc.engine.kv_pool import pool_bytes
    from minivtc.offline.args import VLLMArgs

    gb = 10**9
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (60 * gb, 100 * gb))
    assert pool_bytes(0.9, torch.device("cuda")) == 45 * gb
    args = VLLMArgs(gpu_memory_utilization=0.9)
    assert args.engine_keywords(torch.device("cuda")) == {"kv_bytes": 45 * gb}
    assert args.engine_keywords(torch.device("cpu")) == {}  # a CPU: the pool is kv_tokens
    with pytest.raises(ValueError, match="no room for the KV pool"):
        pool_bytes(0.4, torch.device("cuda"))
