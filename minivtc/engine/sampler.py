"""From a step's logits to each request's next token: what its own history does to them, the
draw (greedy, temperature, top-k, top-p, min-p, each request seeded), and the log-probabilities
it asked for.

Owns `penalize`, `sample()` and `Logprob` (what a caller may ask for, `SamplingParams`, is
`params.py`'s). The runner calls them in vLLM's order:

1. `penalize`, applied to the logits before sampling (greedy too: a penalty can change the
   argmax):

   - `repetition_penalty` r (Keskar et al. 2019, as `transformers`'
     RepetitionPenaltyLogitsProcessor): every token already in the prompt or the output has
     its logit divided by r if positive, multiplied by r if negative (r > 1 makes it less
     likely either way);
   - `frequency_penalty` f and `presence_penalty` p (OpenAI's definitions): a token the output
     holds c times loses f * c + p * (c > 0) from its logit (prompt tokens are not counted);
   - before `min_tokens` outputs, EOS and `stop_token_ids` cannot be sampled (their logits
     -inf).

   Rows of requests that ask for none of these are untouched (no copy).
2. `sample`: greedy rows are one batched argmax; the other rows' distributions are one batch
   too (`probabilities`), and each draws its token with one uniform number from its own
   `torch.Generator` (inverse transform sampling), so a request's tokens depend on its seed
   alone, never on which other requests share its batch.
3. `record_sampled` after each sampled token, `record_prompt` for the prompt positions a
   prefill computed: the log-probabilities a request asked for (`logprobs`,
   `prompt_logprobs`), as vLLM returns them (`Logprob`: the value, its rank, the token's text).
   They are of the model's own distribution, log_softmax of the logits before penalties,
   temperature and the top-k/top-p cuts (vLLM's default, "raw_logprobs"), so a greedy
   request's logprobs equal `transformers`' scores. The request keeps plain Python values
   (`Request.logprobs`).

Does not own: stop conditions (the engine) or the model. Lesson 1 teaches it.

Shape legend: N rows (one per request that needs a token), V vocabulary, U distinct tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from minivtc.requests.params import SamplingParams as SamplingParams  # re-exported: vLLM's home
from minivtc.requests.request import Request

__all__ = ["Logprob", "SamplingParams", "greedy_tokens", "min_p_filter", "penalize", "penalize_row"]
__all__ += ["probabilities", "record_prompt", "record_sampled", "sample", "sample_each"]
__all__ += ["top_p_filter"]


@dataclass(frozen=True)
class Logprob:
    """One token's entry at one position, as vLLM returns it."""

    logprob: float
    rank: int  # 1 for the most likely token
    decoded_token: str | None = None  # filled in by the front door, which has the tokenizer


class SamplingFailed(RuntimeError):
    """Sampling row `row` of the logits failed; `tokens` holds the rows sampled before it."""

    def __init__(self, row: int, cause: Exception, tokens: list[int]) -> None:
        super().__init__(f"sampling row {row} failed: {cause!r}")
        self.row, self.cause, self.tokens = row, cause, tokens


def sample(
    logits: Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int]:
    """One token id per row of `logits` (N, V): a greedy row's argmax, any other a draw from its
    own distribution (`probabilities`) with its own generator. Raises `SamplingFailed` naming
    the first row at fault (the rows before it drawn), so the engine can fail that request
    alone."""
    logits = logits.float()  # (N, V)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return greedy_tokens(logits)
    tokens = [0] * len(params)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    for row, token in zip(greedy, greedy_tokens(logits[greedy]), strict=True):
        tokens[row] = token
    # One batch for every drawn row: the distributions and their cumulative sums are row by row
    # in the arithmetic, so a row's token never depends on the rows beside it.
    probs = probabilities(logits[rows], [params[i] for i in rows])  # (S, V)
    cdf = probs.cumsum(dim=-1, dtype=torch.float64)  # (S, V) (a float32 u could round to 1)
    total = cdf[:, -1]  # (S,) a nan or an inf anywhere in a row reaches its total
    valid = (torch.isfinite(total) & (total > 0)).tolist()
    # Inverse transform sampling: a uniform u per row, from the request's own generator; the
    # row's token is the first at which its cumulative probability reaches (1 - u) of its total,
    # so token t is drawn with probability p_t / total, and a token of probability 0 never.
    draws: list[float] = []

    def settle() -> None:  # the tokens of the rows drawn so far
        targets = (1 - torch.tensor(draws, dtype=torch.float64)) * total[: len(draws)]  # (D,)
        picked = torch.searchsorted(cdf[: len(draws)], targets[:, None]).flatten().tolist()
        for row, token in zip(rows, picked, strict=False):
            tokens[row] = token

    for k, row in enumerate(rows):
        try:
            if not valid[k]:
                raise ValueError("its probabilities are not a distribution (nan, inf or all 0)")
            draws.append(float(torch.rand(1, dtype=torch.float64, generator=generators[row])))
        except Exception as e:
            settle()
            raise SamplingFailed(row, e, tokens[:row]) from e
    settle()
    return tokens


def greedy_tokens(logits: Tensor) -> list[int]:
    """Each row's argmax (N, V) -> N ids: the first of tied maxima, a NaN's index where a row has
    one, as `argmax` gives them. PERF: `max(dim).indices`, not `argmax`, whose CPU reduction
    over a vocabulary is the slower one (what it measured: `minivtc/bench/README.md`)."""
    return logits.max(dim=-1).indices.tolist()


def sample_each(
    logits: Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int | Exception]:
    """`sample`, except that a row whose sampling fails gets its exception in place of a token
    and the rows after it are still sampled (each request's draws stay its own)."""
    out: list[int | Exception] = []
    start = 0
    while start < len(params):
        try:
            out += sample(logits[start:], params[start:], generators[start:])
            break
        except SamplingFailed as e:
            out += [*e.tokens, e.cause]
            start += e.row + 1
    return out


def probabilities(logits: Tensor, params: list[SamplingParams]) -> Tensor:
    """Each row's distribution to draw from (S, V): softmax(logits / T), then the cuts its
    request asked for (top-k, top-p, min-p; what is cut is 0, the rest not renormalized)."""
    # Shift so the largest logit is 0: with a tiny temperature (5e-324 is valid input) logits / T
    # overflow to inf and softmax gives NaN; shifted, the others go to -inf and the distribution
    # is the argmax, as it should be. A temperature below 1e-30 is taken as 1e-30 (in float32
    # a smaller one may round to 0, and 0 / 0 is NaN): any two logits float32 tells apart are
    # then e^(-10^23) apart, so both are the argmax, ties drawn evenly.
    x = logits.cpu().float()  # (S, V)
    temperature = torch.tensor([max(p.temperature, 1e-30) for p in params])  # (S,)
    probs = torch.softmax((x - x.amax(dim=-1, keepdim=True)) / temperature[:, None], dim=-1)
    for k, p in enumerate(params):  # a row at a time: few requests ask for a cut
        if p.top_k > 0:  # (0 and vLLM's -1: no cut)
            kth = torch.topk(probs[k], min(p.top_k, probs.shape[-1])).values[-1]
            probs[k] = torch.where(probs[k] >= kth, probs[k], 0.0)  # (V,)
        if p.top_p < 1:
            probs[k] = top_p_filter(probs[k], p.top_p)  # (V,)
        if p.min_p > 0:
            probs[k] = min_p_filter(probs[k], p.min_p)  # (V,)
    return probs  # (S, V)


def top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches `top_p` (nucleus)."""
    sorted_probs, order = probs.sort(descending=True)  # (V,)
    mass_before = sorted_probs.cumsum(0) - sorted_probs  # (V,) mass of strictly likelier tokens
    sorted_probs[mass_before >= top_p] = 0.0  # the most likely token always survives
    return torch.zeros_like(probs).scatter(0, order, sorted_probs)  # (V,)


def min_p_filter(probs: Tensor, min_p: float) -> Tensor:
    """Keep the tokens at least `min_p` times as likely as the likeliest (Nguyen et al., 2024:
    the cut scales with the model's confidence)."""
    return torch.where(probs >= min_p * probs.max(), probs, 0.0)  # (V,)


# --- what a request's own history does to its logits (before the draw) ---------------------------


def penalize(logits: Tensor, requests: list[Request], eos_id: int) -> Tensor:
    """The (N, V) logits with each request's penalties and min_tokens mask applied."""
    rows = [i for i, r in enumerate(requests) if needs_processing(r)]
    if not rows:
        return logits
    logits = logits.float().clone()  # (N, V): the caller's logits stay as the model gave them
    for i in rows:
        r = requests[i]
        logits[i] = penalize_row(logits[i], r.prompt_ids, r.output_ids, r.params)
        if r.num_output < r.params.min_tokens:
            banned = list(r.params.stop_token_ids) + ([] if r.params.ignore_eos else [eos_id])
            logits[i, banned] = -float("inf")
    return logits


def needs_processing(request: Request) -> bool:
    return request.params.penalized or request.num_output < request.params.min_tokens


def penalize_row(
    logits: Tensor, prompt_ids: list[int], output_ids: list[int], p: SamplingParams
) -> Tensor:
    """One row (V,) with the repetition, frequency and presence penalties applied."""
    if p.repetition_penalty != 1:
        seen = torch.tensor(sorted(set(prompt_ids) | set(output_ids)), device=logits.device)  # (U,)
        score = logits[seen]  # (U,)
        score = torch.where(score < 0, score * p.repetition_penalty, score / p.repetition_penalty)
        # A tiny r (1e-300 is > 0, so allowed) makes score / r overflow to inf, and sampling
        # from inf is NaN: kept at the largest finite logit, the seen tokens still win
        big = torch.finfo(score.dtype).max
        logits = logits.scatter(0, seen, score.clamp(-big, big))  # (V,)
    if output_ids and (p.frequency_penalty or p.presence_penalty):
        ids = torch.tensor(output_ids, device=logits.device)
        counts = torch.bincount(ids, minlength=logits.numel()).to(logits.dtype)  # (V,)
        logits = logits - p.frequency_penalty * counts - p.presence_penalty * (counts > 0)
    return logits


# --- the log-probabilities a request asked for (of the logits before any of this) ----------------


def record_sampled(logits: Tensor, requests: list[Request], tokens: list[int | Exception]) -> None:
    """Each request that asked for `logprobs`: the sampled token's logprob (and the running
    sum) and the top `logprobs` of the distribution it was drawn from (rows of `logits`)."""
    for row, (r, token) in enumerate(zip(requests, tokens, strict=True)):
        if r.params.logprobs is None or isinstance(token, Exception):
            continue
        lp = torch.log_softmax(logits[row].float(), dim=-1)  # (V,)
        if r.logprobs is None:
            r.logprobs = []
        r.logprobs.append(top_logprobs(lp, r.params.logprobs, token))
        r.cumulative_logprob = (r.cumulative_logprob or 0.0) + float(lp[token])


def record_prompt(logits: Tensor, request: Request, start: int) -> None:
    """Prompt logprobs from a prefill: row j of `logits` predicted prompt position start + j + 1
    (position 0 has none: nothing precedes it; positions a prefix cache held have none)."""
    if request.prompt_logprobs is None:
        request.prompt_logprobs = [None] * (start + 1)
    lp = torch.log_softmax(logits.float(), dim=-1)  # (rows, V)
    k = request.params.prompt_logprobs
    assert k is not None, "asked for by a request with prompt_logprobs only"
    for j in range(lp.shape[0]):
        token = request.prompt_ids[start + j + 1]
        request.prompt_logprobs.append(top_logprobs(lp[j], k, token))


def top_logprobs(lp: Tensor, k: int, chosen: int) -> dict[int, Logprob]:
    """The chosen token's entry first, then the k most likely (vLLM's order)."""
    rank = int((lp > lp[chosen]).sum()) + 1
    entries = {chosen: Logprob(float(lp[chosen]), rank)}
    if k:
        values, ids = lp.topk(k)
        for j, (v, t) in enumerate(zip(values.tolist(), ids.tolist(), strict=True)):
            entries.setdefault(t, Logprob(v, j + 1))
    return entries
