"""The catalogue of wrong solutions: mistakes a student makes, each of which must lose points.

Owns `WRONG` (each entry: the assignment, the mistake in a student's words, and the edits that
make it from the reference's functions; `check.write_edition` makes the submission). The
grader's own check (`check.py`: `minivtc course check-grader`, and tests/test_course_grader.py
in CI) grades every entry and fails if one keeps full marks. Not shipped in the student
edition: the edits quote the reference.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Wrong:
    key: str  # the assignment
    what: str  # the mistake
    edits: tuple[tuple[str, str, str], ...]  # (qualified name, text in its body, replaced by)
    own_file: str | None = None  # an own-file assignment's file, written whole instead


def w(key: str, what: str, *edits: tuple[str, str, str]) -> Wrong:
    return Wrong(key, what, edits)


RMS, ROT, APPLY, ATT = "RMSNorm.forward", "rotary_cos_sin", "apply_rotary", "causal_attention"
ALLOC, GROW, FREE, SLOTS = (f"BlockAllocator.{m}" for m in ("allocate", "grow", "free", "slots"))
RESERVE, STEP = "FullReservation.reserve", "Engine.step"
PEEK, DISPATCH, LIFT, CHARGE, FINISH = (
    f"VTC.{m}" for m in ("peek", "dispatch", "lift_counter", "charge_outputs", "on_finish")
)
METRIC = "table_metrics"
# a6: the capstone's answer (DRR) edited, and the policy built on it
D_ADD, D_PEEK, D_DISPATCH, D_DECODE = (f"DRR.{m}" for m in ("add", "peek", "dispatch", "on_decode"))

A1 = [
    w("a1_llama", "RMSNorm without eps", (RMS, " + self.eps)", ")")),
    w("a1_llama", "RMSNorm's mean over tokens, not features", (RMS, ".mean(-1,", ".mean(0,")),
    w(
        "a1_llama",
        "RMSNorm multiplies by the root mean square",
        (RMS, "torch.rsqrt(", "torch.sqrt("),
    ),
    w("a1_llama", "RMSNorm forgets its weight", (RMS, "return self.weight * x32", "return x32")),
    w("a1_llama", "RoPE with theta fixed at 10,000", (ROT, "config.rope_theta **", "10000.0 **")),
    w(
        "a1_llama",
        "RoPE's frequencies interleaved (GPT-J layout), not halves",
        (ROT, "torch.cat([angles, angles], dim=-1)", "angles.repeat_interleave(2, dim=-1)"),
    ),
    w(
        "a1_llama",
        "cos and sin swapped",
        (ROT, "angles.cos(), angles.sin()", "angles.sin(), angles.cos()"),
    ),
    w(
        "a1_llama",
        "rotation with the wrong sign",
        (APPLY, "x * cos + rotate_half", "x * cos - rotate_half"),
    ),
    w("a1_llama", "attention not causal", (ATT, "is_causal=True", "is_causal=False")),
    w(
        "a1_llama",
        "grouped queries tiled (head h reads K/V head h % K)",
        (
            ATT,
            "    out = F.scaled",
            "    k, v = k.repeat(1, h // k.shape[1], 1, 1), v.repeat(1, h // v.shape[1], 1, 1)\n"
            "    out = F.scaled",
        ),
    ),
    w(
        "a1_llama",
        "attention across the sequences of the batch",
        (ATT, "s = t // batch", "s, batch = t, 1"),
    ),
]
A2 = [
    w(
        "a2_blocks",
        "allocate rounds the blocks down",
        (ALLOC, "self.blocks_needed(num_tokens)", "num_tokens // self.block_size"),
    ),
    w(
        "a2_blocks",
        "allocate leaves its blocks on the free list",
        (ALLOC, "del self.free_blocks[top:]", "pass"),
    ),
    w(
        "a2_blocks",
        "allocate takes other blocks than it removes",
        (ALLOC, "self.free_blocks[top:][::-1]", "self.free_blocks[:n]"),
    ),
    w(
        "a2_blocks",
        "allocate does not record the table",
        (ALLOC, "self.block_tables[request_id] = table", "pass"),
    ),
    w(
        "a2_blocks",
        "grow takes a block too many at a block's end",
        (GROW, "self.block_size < num_tokens", "self.block_size <= num_tokens"),
    ),
    w("a2_blocks", "grow adds at most one block", (GROW, "while len(table)", "if len(table)")),
    w(
        "a2_blocks",
        "free forgets to return the blocks",
        (
            FREE,
            "self.free_blocks.extend(reversed(self.block_tables.pop(request_id)))",
            "self.block_tables.pop(request_id)",
        ),
    ),
    w(
        "a2_blocks",
        "free keeps the table",
        (FREE, "self.block_tables.pop(request_id)", "self.block_tables[request_id]"),
    ),
    w(
        "a2_blocks",
        "slots forget the block size",
        (SLOTS, "table[p // bs] * bs + p % bs", "table[p // bs] + p % bs"),
    ),
    w(
        "a2_blocks",
        "slots ignore the block table (contiguous)",
        (SLOTS, "table[p // bs] * bs + p % bs", "table[0] * bs + p"),
    ),
    w(
        "a2_blocks",
        "slots shifted by one position",
        (SLOTS, "range(start, end)", "range(start + 1, end + 1)"),
    ),
]
A3 = [
    w(
        "a3_batching",
        "reserve the prompt only",
        (RESERVE, "request.max_num_tokens", "request.num_prompt"),
    ),
    w(
        "a3_batching",
        "reserve one token short",
        (RESERVE, "request.max_num_tokens", "request.max_num_tokens - 1"),
    ),
    w(
        "a3_batching",
        "reserve says yes when it took nothing",
        (
            RESERVE,
            "return reserve_blocks(self.allocator, request, request.max_num_tokens)",
            "reserve_blocks(self.allocator, request, request.max_num_tokens)\n        return True",
        ),
    ),
    w("a3_batching", "step never admits", (STEP, "self.schedule()  #", "pass  #")),
    w(
        "a3_batching",
        "step never grows the blocks (blocks on demand)",
        (STEP, "self.grow()  #", "pass  #"),
    ),
    w("a3_batching", "step never charges the clients", (STEP, "self.charge(batch)", "pass")),
    w("a3_batching", "step never retires", (STEP, "self.retire(request)", "pass")),
    w(
        "a3_batching",
        "step retires every request",
        (STEP, "if request.finish_reason is not None:", "if True:"),
    ),
    w("a3_batching", "step never checks the invariants", (STEP, "self.check()", "pass")),
    w(
        "a3_batching",
        "step appends the tokens without the stop rules",
        (STEP, "self.append(request, token)", "request.output_ids.append(token)"),
    ),
]
A4 = [
    w(
        "a4_vtc",
        "a lift that can lower a counter",
        (LIFT, "floor is not None and floor > self.counters[client]", "floor is not None"),
    ),
    w(
        "a4_vtc",
        "a lift to the largest waiting counter",
        (
            LIFT,
            "floor = self.join_floor()",
            "waiting = [self.counters[c] for c, q in self.queues.items() if q]\n"
            "        floor = max(waiting) if waiting else self.join_floor()",
        ),
    ),
    w(
        "a4_vtc",
        "ties go to the client seen last",
        (
            PEEK,
            "client = self.least.least()",
            "waiting = [c for c, q in self.queues.items() if q][::-1]\n"
            "        client = min(waiting, key=self.counters.__getitem__, default=None)",
        ),
    ),
    w(
        "a4_vtc",
        "never calls predictor.observe",
        (FINISH, "self.predictor.observe(request)", "pass"),
    ),
    w(
        "a4_vtc",
        "observes aborted requests too",
        (FINISH, ' and request.finish_reason != "abort"', ""),
    ),
    w(
        "a4_vtc",
        "a charge valid only for the linear cost",
        (CHARGE, "now = cost(len(request.prompt_ids), n_q)", "now = service + 2.0 * (n_q - q)"),
    ),
    w("a4_vtc", "no cache discount", (DISPATCH, "service - discount)", "service)")),
    w(
        "a4_vtc",
        "no dispatch charge",
        (DISPATCH, "self.charge(request.client_id, service - discount)", "pass"),
    ),
    w("a4_vtc", "never sets last_left", (DISPATCH, "self.last_left = request.client_id", "pass")),
    w(
        "a4_vtc",
        "a readmitted request's prompt charged again",
        (DISPATCH, "if not request.num_preemptions:", "if True:"),
    ),
    w("a4_vtc", "the refund with the wrong sign", (FINISH, "now - service)", "service - now)")),
    w("a4_vtc", "no refund", (FINISH, "self.charge(request.client_id, now - service)", "pass")),
    w(
        "a4_vtc",
        "the lift to Algorithm 2's floor alone, not fair preemption's",
        (LIFT, "floor = self.join_floor()", "floor = self.lift_floor()"),
    ),
    w(
        "a4_vtc",
        "each client's queue served last in, first out",
        (PEEK, "self.queues[client][0]", "self.queues[client][-1]"),
        (DISPATCH, "assert queue[0] is request", "assert queue[-1] is request"),
        (DISPATCH, "queue.popleft()", "queue.pop()"),
    ),
    w(
        "a4_vtc",
        "Algorithm 3's refund written linear, w_q (predicted - actual), whatever h",
        (
            FINISH,
            "now = self.cost(request.num_prompt, request.num_output)\n"
            "            self.charge(request.client_id, now - service)",
            "w_q = weights_of(self.cost)[1]\n"
            "            self.charge(request.client_id, -w_q * (q - request.num_output))",
        ),
    ),
    w(
        "a4_vtc",
        "Algorithm 3's dispatch charge written linear, w_p n_p + w_q predicted, whatever h",
        (
            DISPATCH,
            "service = self.cost(request.num_prompt, predicted)",
            "w_p, w_q = weights_of(self.cost)\n"
            "            service = w_p * request.num_prompt + w_q * predicted",
        ),
    ),
    w(
        "a4_vtc",
        "output charges ignore the weights",
        (CHARGE, ") / weights.get(request.client_id, 1.0)", ")"),
    ),
]
A5 = [
    w(
        "a5_metric",
        "the shortfall not capped by the demand",
        (METRIC, "min(best - s[c], abs(r[c] - s[c]))", "best - s[c]"),
    ),
    w("a5_metric", "a tick too many", (METRIC, "range(1, num_x)", "range(0, num_x)")),
    w("a5_metric", "a 30-second window", (METRIC, "lo + 60, cost", "lo + 30, cost")),
    w(
        "a5_metric",
        "the sample variance",
        (METRIC, "statistics.pvariance(diffs)", "statistics.variance(diffs)"),
    ),
    w(
        "a5_metric",
        "the median difference as the average",
        (METRIC, "statistics.fmean(diffs)", "statistics.median(diffs)"),
    ),
    w(
        "a5_metric",
        "throughput of output tokens only",
        (METRIC, "r.input_tokens + r.output_tokens", "r.output_tokens"),
    ),
    w(
        "a5_metric",
        "ticks that ignore the warm-up",
        (METRIC, "lo = (horizon - warmup) * i", "lo = horizon * i"),
    ),
    w(
        "a5_metric",
        "the shortfall against the mean, not the best",
        (METRIC, "best = max(s.values())", "best = sum(s.values()) / len(s)"),
    ),
    w(
        "a5_metric",
        "Max and Avg swapped",
        (METRIC, "max(diffs), statistics.fmean(diffs)", "statistics.fmean(diffs), max(diffs)"),
    ),
    w(
        "a5_metric",
        "the demand priced with the service's cost",
        (METRIC, "lo + 60, demand_cost", "lo + 60, cost"),
    ),
]
# Not here: decode charges valid only for the linear cost (the capstone prices service with the
# linear cost: not wrong for the task as stated); a client that keeps its leftover deficit while
# idle, or may dispatch down to minus one quantum (each moves the gap by a quantum at most, which
# the stated bound covers: a different fair policy, not a wrong one; both graded 30/30).
A6 = [
    w("a6_fair", "never charges prompts", (D_DISPATCH, "self.deficits[client] -= service", "pass")),
    w(
        "a6_fair",
        "ignores decode charges",
        (D_DECODE, "self.deficits[r.client_id] -= now - before", "pass"),
    ),
    w(
        "a6_fair",
        "a quantum at every peek, not every turn",
        (D_PEEK, "if not self.turn_begun:", "if True:"),
    ),
    w("a6_fair", "the turn never passes", (D_PEEK, "if self.deficits[client] > 0:", "if True:")),
    w(
        "a6_fair",
        "a debt forgiven when a client rejoins",
        (
            D_ADD,
            "self.join_if_idle(request.client_id).append(request)",
            "if not self.queues.get(request.client_id):\n"
            "            self.deficits[request.client_id] = 0.0\n"
            "        self.join_if_idle(request.client_id).append(request)",
        ),
    ),
    w(
        "a6_fair",
        "a client whose queue empties stays in the round",
        (D_DISPATCH, "self.active.popleft()", "pass"),
    ),
    w(
        "a6_fair",
        "the next client's turn begins without its quantum when one leaves the round",
        (
            D_DISPATCH,
            "self.active.popleft()\n            self.turn_begun = False",
            "self.active.popleft()",
        ),
    ),
    w(
        "a6_fair",
        "a readmitted request's prompt charged again",
        (D_DISPATCH, "if not request.num_preemptions:", "if True:"),
    ),
]
FAIR = "FairPolicy.__init__"  # the capstone's own file: the policy built on the answer
A6 += [
    w(
        "a6_fair",
        "a quantum far above U (round robin by whole backlogs)",
        (FAIR, "super().__init__(QUANTUM, cost)", "super().__init__(1e9, cost)"),
    ),
    w(
        "a6_fair",
        "a stated bound that ignores U (a constant)",
        (
            FAIR,
            'self.name = "fair"',
            'self.name = "fair"\n        self.gap_bound = lambda u: 100.0',
        ),
    ),
    w(
        "a6_fair",
        "no bound stated",
        (FAIR, 'self.name = "fair"', 'self.name = "fair"\n        self.gap_bound = lambda u: None'),
    ),
]
A6 += [
    w(
        "a6_fair",
        "charges each request's whole max_tokens at dispatch and never refunds",
        (
            D_DISPATCH,
            "service = self.cost(request.num_prompt, 0)",
            "service = self.cost(request.num_prompt, request.params.max_tokens)",
        ),
        (D_DECODE, "self.deficits[r.client_id] -= now - before", "pass"),
    ),
    w(
        "a6_fair",
        "states 4U, the loosest bound allowed, whatever the policy does",
        (
            FAIR,
            'self.name = "fair"',
            'self.name = "fair"\n        self.gap_bound = lambda u: 4 * u',
        ),
    ),
    w(
        "a6_fair",
        "states a bound looser than 4U",
        (
            FAIR,
            'self.name = "fair"',
            'self.name = "fair"\n        self.gap_bound = lambda u: 5 * u',
        ),
    ),
    Wrong(
        "a6_fair",
        "FairPolicy subclasses the reference VTC (three lines)",
        (),
        own_file='''"""My capstone."""

from minivtc.fairness.vtc import VTC


class FairPolicy(VTC):
    BOUND = ("Theorem 4.4 of the paper: two clients backlogged over an interval receive "
             "service within 2U of each other, by Lemma 4.3 and the lift.")
''',
    ),
    Wrong(
        "a6_fair",
        "FairPolicy built by name through make_scheduler",
        (),
        own_file='''"""My capstone."""

from minivtc.fairness import policies


class FairPolicy:
    BOUND = ("Theorem 4.4 of the paper: two clients backlogged over an interval receive "
             "service within 2U of each other, by Lemma 4.3 and the lift.")

    def __new__(cls, *args, **kwargs):
        return policies.make_scheduler("vtc")
''',
    ),
]
WRONG = A1 + A2 + A3 + A4 + A5 + A6
