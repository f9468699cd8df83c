"""The catalogue of wrong solutions: mistakes a student makes, each of which must lose points.

Owns `WRONG` and the wrong solutions of a1, a2, a3 and a5 (the model, the blocks, the batching
step, the metric); those of the policies, a4 and a6, are in `wrong_policies.py`, those of the
design assignments, d1 and d2, in `wrong_design.py`. Each entry is
the assignment, the mistake in a student's words, and the edits that make it from the
reference's functions, written on the syntax tree (`edits.py`: a pattern and its replacement),
so a reformat of the reference, or a rename of what a pattern does not spell, leaves it as it
is. Each function an edit targets is named once, (file, qualified name), in the constants
below. The grader's own check (`check.py`: `minivtc course check-grader`, and
tests/test_course_grader.py in CI) grades every entry and fails if one keeps full marks. Not
shipped in the student edition: the edits quote the reference.
"""

from __future__ import annotations

from minivtc.course.edits import Wrong, drop, replace, rewrite, wrong
from minivtc.course.wrong_design import D1, D2
from minivtc.course.wrong_mechanisms import MECHANISMS
from minivtc.course.wrong_policies import A4, A6

__all__ = ["WRONG", "Wrong"]

LLAMA, KV_POOL = "model/llama.py", "engine/kv_pool.py"
RMS, ROT = (LLAMA, "RMSNorm.forward"), (LLAMA, "rotary_cos_sin")
APPLY, ATT = (LLAMA, "apply_rotary"), (LLAMA, "causal_attention")
ALLOC, GROW, FREE, SLOTS = (
    (KV_POOL, f"BlockAllocator.{m}") for m in ("allocate", "grow", "free", "slots")
)
RESERVE = ("engine/admission.py", "FullReservation.reserve")
STEP = ("engine/engine.py", "Engine.step")
METRIC = ("sim/metrics.py", "table_metrics")

A1 = [
    wrong("a1_llama", "RMSNorm without eps", replace(RMS, "_a + _.eps", "_a")),
    wrong(
        "a1_llama",
        "RMSNorm's mean over tokens, not features",
        replace(RMS, "_x.mean(-1, keepdim=_k)", "_x.mean(0, keepdim=_k)"),
    ),
    wrong(
        "a1_llama",
        "RMSNorm multiplies by the root mean square",
        replace(RMS, "_m.rsqrt(_a)", "_m.sqrt(_a)"),
    ),
    wrong("a1_llama", "RMSNorm forgets its weight", replace(RMS, "_.weight * _x", "_x")),
    wrong("a1_llama", "RoPE with theta fixed at 10,000", replace(ROT, "_.rope_theta", "10000.0")),
    wrong(
        "a1_llama",
        "RoPE's frequencies interleaved (GPT-J layout), not halves",
        replace(ROT, "_.cat([_a, _a], dim=-1)", "_a.repeat_interleave(2, dim=-1)"),
    ),
    wrong(
        "a1_llama",
        "cos and sin swapped",
        replace(ROT, "(_a.cos(), _a.sin())", "(_a.sin(), _a.cos())"),
    ),
    wrong("a1_llama", "rotation with the wrong sign", replace(APPLY, "_a + _b", "_a - _b")),
    wrong(
        "a1_llama",
        "attention not causal",
        replace(
            ATT,
            "_f(_q, _k, _v, is_causal=True, enable_gqa=_g)",
            "_f(_q, _k, _v, is_causal=False, enable_gqa=_g)",
        ),
    ),
    wrong(
        "a1_llama",
        "grouped queries tiled (head h reads K/V head h % K)",
        rewrite(
            ATT,
            "_o = _f(_q, _k, _v, is_causal=_c, enable_gqa=_g)",
            """
            _k, _v = _k.repeat(1, h // _k.shape[1], 1, 1), _v.repeat(1, h // _v.shape[1], 1, 1)
            _o = _f(_q, _k, _v, is_causal=_c, enable_gqa=_g)
            """,
        ),
    ),
    wrong(
        "a1_llama",
        "attention across the sequences of the batch",
        rewrite(ATT, "_s = _t // _b", "_s, _b = _t, 1"),
    ),
]
A2 = [
    wrong(
        "a2_blocks",
        "allocate rounds the blocks down",
        replace(ALLOC, "_s.blocks_needed(_n)", "_n // _s.block_size"),
    ),
    wrong("a2_blocks", "allocate leaves its blocks on the free list", drop(ALLOC, "del _")),
    wrong(
        "a2_blocks",
        "allocate takes other blocks than it removes",
        replace(ALLOC, "_f[_t:][::-1]", "_f[:n]"),
    ),
    wrong("a2_blocks", "allocate does not record the table", drop(ALLOC, "_.block_tables[_] = _")),
    wrong(
        "a2_blocks",
        "grow takes a block too many at a block's end",
        replace(GROW, "_a < _b", "_a <= _b"),
    ),
    wrong(
        "a2_blocks",
        "grow adds at most one block",
        rewrite(GROW, "while _c:\n    _body", "if _c:\n    _body"),
    ),
    wrong(
        "a2_blocks",
        "free forgets to return the blocks",
        replace(FREE, "_.extend(reversed(_a))", "_a"),
    ),
    wrong("a2_blocks", "free keeps the table", replace(FREE, "_t.pop(_r)", "_t[_r]")),
    wrong(
        "a2_blocks",
        "slots forget the block size",
        replace(SLOTS, "_t[_p // _b] * _b + _p % _b", "_t[_p // _b] + _p % _b"),
    ),
    wrong(
        "a2_blocks",
        "slots ignore the block table (contiguous)",
        replace(SLOTS, "_t[_p // _b] * _b + _p % _b", "_t[0] * _b + _p"),
    ),
    wrong(
        "a2_blocks",
        "slots shifted by one position",
        replace(SLOTS, "range(_a, _b)", "range(_a + 1, _b + 1)"),
    ),
]
A3 = [
    wrong(
        "a3_batching",
        "reserve the prompt only",
        replace(RESERVE, "_r.max_num_tokens", "_r.num_prompt"),
    ),
    wrong(
        "a3_batching",
        "reserve one token short",
        replace(RESERVE, "_r.max_num_tokens", "_r.max_num_tokens - 1"),
    ),
    wrong(
        "a3_batching",
        "reserve says yes when it took nothing",
        rewrite(RESERVE, "return _a", "_a\nreturn True"),
    ),
    wrong("a3_batching", "step never admits", drop(STEP, "_.schedule()")),
    # a4b's (Lesson 10's blocks on demand), on a3's step
    wrong("a4b_variants", "step never grows the blocks (blocks on demand)", drop(STEP, "_.grow()")),
    wrong("a3_batching", "step never charges the clients", drop(STEP, "_.charge(_)")),
    wrong("a3_batching", "step never retires", drop(STEP, "_.retire(_)")),
    wrong(
        "a3_batching",
        "step retires every request",
        replace(STEP, "_r.finish_reason is not None", "True"),
    ),
    wrong("a3_batching", "step never checks the invariants", drop(STEP, "_.check()")),
    wrong(
        "a3_batching",
        "step appends the tokens without the stop rules",
        replace(STEP, "_.append(_r, _t)", "_r.output_ids.append(_t)"),
    ),
]
A5 = [
    wrong(
        "a5_metric",
        "the shortfall not capped by the demand",
        replace(METRIC, "min(_a, abs(_b))", "_a"),
    ),
    wrong("a5_metric", "a tick too many", replace(METRIC, "range(1, _n)", "range(0, _n)")),
    wrong(
        "a5_metric",
        "a 30-second window",
        replace(METRIC, "service(_s, _lo, _lo + 60, _c)", "service(_s, _lo, _lo + 30, _c)"),
    ),
    wrong(
        "a5_metric",
        "the sample variance",
        replace(METRIC, "_m.pvariance(_d)", "_m.variance(_d)"),
    ),
    wrong(
        "a5_metric",
        "the median difference as the average",
        replace(METRIC, "_m.fmean(_d)", "_m.median(_d)"),
    ),
    wrong(
        "a5_metric",
        "throughput of output tokens only",
        replace(METRIC, "_r.input_tokens + _r.output_tokens", "_r.output_tokens"),
    ),
    wrong(
        "a5_metric",
        "ticks that ignore the warm-up",
        replace(METRIC, "(_h - _w) * _i", "_h * _i"),
    ),
    wrong(
        "a5_metric",
        "the shortfall against the mean, not the best",
        replace(METRIC, "max(_s.values())", "sum(_s.values()) / len(_s)"),
    ),
    wrong(
        "a5_metric",
        "Max and Avg swapped",
        replace(METRIC, "_t(max(_d), _avg, _var, _x)", "_t(_avg, max(_d), _var, _x)"),
    ),
    wrong(
        "a5_metric",
        "the demand priced with the service's cost",
        replace(METRIC, "demand(_s, _a, _b, _c)", "demand(_s, _a, _b, cost)"),
    ),
]
WRONG: list[Wrong] = A1 + A2 + A3 + A4 + A5 + A6 + MECHANISMS + D1 + D2
