"""The catalogue's wrong solutions of the policies: a4 and a4b (VTC) and a6 (the capstone).

Owns `A4` (a4's and a4b's: a4b extends a4's functions) and `A6`, written as `wrong.py`'s are
(`edits.py`). Each function an edit targets is named once, (file, qualified name), in the
constants below: a method that moves (say, from VTC to its books) is retargeted there. The
patterns leave the receiver of a call open (`_.charge`, not `self.charge`) where the mistake is
about the call, not about who answers it. a6's entries edit the instructor's answer (DRR,
`fairness/drr.py`) and the policy built on it in the capstone's own file, or write that file
whole. Not shipped in the student edition."""

from __future__ import annotations

from minivtc.course.edits import Wrong, drop, replace, rewrite, wrong

__all__ = ["A4", "A6", "RETYPED_VTC"]

VTC_FILE, DRR_FILE = "fairness/vtc.py", "fairness/drr.py"
PEEK, DISPATCH, LIFT = (
    (VTC_FILE, "VTC.peek"),
    (VTC_FILE, "VTC.dispatch"),
    (VTC_FILE, "VTC.lift_counter"),
)
CHARGE, FINISH = (VTC_FILE, "VTC.charge_outputs"), (VTC_FILE, "VTC.on_finish")
D_ADD, D_PEEK = (DRR_FILE, "DRR.add"), (DRR_FILE, "DRR.peek")
D_DISPATCH, D_DECODE = (DRR_FILE, "DRR.dispatch"), (DRR_FILE, "DRR.on_decode")
FAIR = ("course/capstone.py", "FairPolicy.__init__")  # the policy built on the answer


def stated_bound(what: str, bound: str) -> Wrong:
    """The capstone's policy states `bound`, an expression of U (`u`), whatever it does."""
    statement = f"_s.name = _n\n_s.gap_bound = lambda u: {bound}"
    return wrong("a6_fair", what, rewrite(FAIR, "_s.name = _n", statement))


# A capstone that types VTC (Algorithm 2) from scratch: allowed, and graded as any policy is
# (`graded/test_a6_fair.py`); the catalogue's entry is this with one mistake in the lift.
RETYPED_VTC = '''"""My capstone: Algorithm 2, typed from the paper."""

from collections import deque

from minivtc.fairness.cost import PAPER_COST
from minivtc.fairness.scheduler import Scheduler


class FairPolicy(Scheduler):
    BOUND = ("Theorem 4.4: two clients backlogged over an interval receive service within 2U "
             "of each other, as the lift keeps the waiting counters within U (Lemma 4.3).")

    def __init__(self, cost=PAPER_COST):
        self.cost, self.counters, self.queues, self.last_left = cost, {}, {}, None

    def add(self, request, now):
        c = request.client_id
        self.queues.setdefault(c, deque())
        if not self.queues[c]:
            waiting = [self.counters[k] for k, q in self.queues.items() if q]
            floor = min(waiting) if waiting else self.counters.get(self.last_left)
            if floor is not None:
                self.counters[c] = max(self.counters.get(c, 0.0), floor)
        self.counters.setdefault(c, 0.0)
        self.queues[c].append(request)

    def peek(self):
        waiting = [c for c, q in self.queues.items() if q]
        least = min(waiting, key=self.counters.__getitem__, default=None)
        return None if least is None else self.queues[least][0]

    def dispatch(self, request):
        if not request.num_preemptions:
            self.counters[request.client_id] += self.cost(request.num_prompt, 0)
        self.remove(request)

    def on_decode(self, requests):
        for r in requests:
            n_p, n_q = r.num_prompt, len(r.output_ids)
            self.counters[r.client_id] += self.cost(n_p, n_q) - self.cost(n_p, n_q - 1)

    def remove(self, request):
        self.queues[request.client_id].remove(request)
        if not self.queues[request.client_id]:
            self.last_left = request.client_id

    def requeue(self, request):
        self.add(request, 0.0)
        self.queues[request.client_id].rotate(1)

    def waiting(self):
        return (r for q in self.queues.values() for r in q)

    def gap_bound(self, u):
        return 2 * u
'''

A4 = [
    wrong(
        "a4_vtc",
        "a lift that can lower a counter",
        replace(LIFT, "_f is not None and _f > _c", "_f is not None"),
    ),
    wrong(
        "a4_vtc",
        "a lift to the largest waiting counter",
        rewrite(
            LIFT,
            "_f = _s.join_floor()",
            """
            waiting = [_s.counters[c] for c, q in _s.queues.items() if q]
            _f = max(waiting) if waiting else _s.join_floor()
            """,
        ),
    ),
    wrong(
        "a4_vtc",
        "ties go to the client seen last",
        rewrite(
            PEEK,
            "_c = _.least()",
            """
            waiting = [c for c, q in self.queues.items() if q][::-1]
            _c = min(waiting, key=self.counters.__getitem__, default=None)
            """,
        ),
    ),
    wrong("a4b_variants", "never calls predictor.observe", drop(FINISH, "_.observe(_)")),
    wrong(
        "a4b_variants",
        "observes aborted requests too",
        replace(FINISH, "_a and _.finish_reason != 'abort'", "_a"),
    ),
    wrong(
        "a4b_variants",
        "a charge valid only for the linear cost",
        rewrite(CHARGE, "_now = _h(len(_r.prompt_ids), _n)", "_now = service + 2.0 * (_n - q)"),
    ),
    wrong(
        "a4b_variants",
        "no cache discount",
        replace(DISPATCH, "_o.charge(_c, _s - _d)", "_o.charge(_c, _s)"),
    ),
    wrong("a4_vtc", "no dispatch charge", drop(DISPATCH, "_.charge(_, _)")),
    wrong("a4_vtc", "never sets last_left", drop(DISPATCH, "_.last_left = _")),
    wrong(
        "a4b_variants",
        "a readmitted request's prompt charged again",
        replace(DISPATCH, "not _.num_preemptions", "True"),
    ),
    wrong(
        "a4b_variants",
        "the refund with the wrong sign",
        replace(FINISH, "_o.charge(_c, _a - _b)", "_o.charge(_c, _b - _a)"),
    ),
    wrong("a4b_variants", "no refund", drop(FINISH, "_.charge(_, _)")),
    wrong(
        "a4b_variants",
        "the lift to Algorithm 2's floor alone, not fair preemption's",
        replace(LIFT, "_s.join_floor()", "_s.lift_floor()"),
    ),
    wrong(
        "a4_vtc",
        "each client's queue served last in, first out",
        replace(PEEK, "_q[_c][0]", "_q[_c][-1]"),
        replace(DISPATCH, "_q[0] is _r", "_q[-1] is _r"),
        replace(DISPATCH, "_q.popleft()", "_q.pop()"),
    ),
    wrong(
        "a4b_variants",
        "Algorithm 3's refund written linear, w_q (predicted - actual), whatever h",
        rewrite(
            FINISH,
            """
            _now = _s.cost(_p, _n)
            _o.charge(_c, _now - _service)
            """,
            """
            w_q = weights_of(_s.cost)[1]
            _o.charge(_c, -w_q * (q - _n))
            """,
        ),
    ),
    wrong(
        "a4b_variants",
        "Algorithm 3's dispatch charge written linear, w_p n_p + w_q predicted, whatever h",
        rewrite(
            DISPATCH,
            "_service = _s.cost(_p, _predicted)",
            """
            w_p, w_q = weights_of(_s.cost)
            _service = w_p * _p + w_q * _predicted
            """,
        ),
    ),
    wrong(
        "a4b_variants",
        "output charges ignore the weights",
        replace(CHARGE, "_a / _w.get(_c, 1.0)", "_a"),
    ),
    wrong(
        "a4_vtc",
        "ties go to the client with the longest queue",
        rewrite(
            PEEK,
            "_c = _.least()",
            """
            waiting = [c for c, q in self.queues.items() if q]
            _c = min(
                waiting,
                key=lambda c: (self.counters[c], -len(self.queues[c])),
                default=None,
            )
            """,
        ),
    ),
    wrong(
        "a4b_variants",
        "Algorithm 3's refund through lower(), stopped at the smallest waiting counter",
        replace(FINISH, "_o.charge(_c, _a - _b)", "_o.ledger.lower(_c, _b - _a)"),
    ),
    wrong(
        "a4_vtc",
        "output charges sent to the wrong client",
        replace(CHARGE, "_w[_r.client_id]", "_w[requests[0].client_id]"),
    ),
]
# Not here: decode charges valid only for the linear cost (the capstone prices service with the
# linear cost: not wrong for the task as stated); a client that keeps its leftover deficit while
# idle, or may dispatch down to minus one quantum (each moves the gap by a quantum at most, which
# the stated bound covers: a different fair policy, not a wrong one; both graded 30/30).
A6 = [
    wrong("a6_fair", "never charges prompts", drop(D_DISPATCH, "_.deficits[_] -= _")),
    wrong("a6_fair", "ignores decode charges", drop(D_DECODE, "_.deficits[_] -= _")),
    wrong(
        "a6_fair",
        "a quantum at every peek, not every turn",
        replace(D_PEEK, "not _.turn_begun", "True"),
    ),
    wrong("a6_fair", "the turn never passes", replace(D_PEEK, "_.deficits[_] > 0", "True")),
    wrong(
        "a6_fair",
        "a debt forgiven when a client rejoins",
        rewrite(
            D_ADD,
            "_s.join_if_idle(_r.client_id).append(_r)",
            """
            if not _s.queues.get(_r.client_id):
                _s.deficits[_r.client_id] = 0.0
            _s.join_if_idle(_r.client_id).append(_r)
            """,
        ),
    ),
    wrong(
        "a6_fair",
        "a client whose queue empties stays in the round",
        drop(D_DISPATCH, "_.active.popleft()"),
    ),
    wrong(
        "a6_fair",
        "the next client's turn begins without its quantum when one leaves the round",
        drop(D_DISPATCH, "_.turn_begun = False"),
    ),
    wrong(
        "a6_fair",
        "a readmitted request's prompt charged again",
        replace(D_DISPATCH, "not _.num_preemptions", "True"),
    ),
    wrong(
        "a6_fair",
        "a quantum far above U (round robin by whole backlogs)",
        replace(FAIR, "super().__init__(_q, _c)", "super().__init__(1e9, _c)"),
    ),
    stated_bound("a stated bound that ignores U (a constant)", "100.0"),
    stated_bound("no bound stated", "None"),
    wrong(
        "a6_fair",
        "charges each request's whole max_tokens at dispatch and never refunds",
        replace(D_DISPATCH, "_h(_r.num_prompt, 0)", "_h(_r.num_prompt, _r.params.max_tokens)"),
        drop(D_DECODE, "_.deficits[_] -= _"),
    ),
    stated_bound("states 4U, the loosest bound allowed, whatever the policy does", "4 * u"),
    stated_bound("states a bound looser than 4U", "5 * u"),
    Wrong(
        "a6_fair",
        "VTC typed from scratch whose lift sets the counter to the floor, so can lower it",
        own_file=RETYPED_VTC.replace("max(self.counters.get(c, 0.0), floor)", "floor"),
    ),
    Wrong(
        "a6_fair",
        "FairPolicy subclasses the reference VTC (three lines)",
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
