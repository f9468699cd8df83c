"""The catalogue's wrong solutions of the mechanisms a student writes beside VTC's hooks: a4's
counter structure (`LeastCounter`), joining Q, the lift's floor and the charge; a4b's fair
victim (`preemption.Fair`) and fair preemption's lift (`FairLift`). Written as `wrong.py`'s
are (`edits.py`); each must lose points. Not shipped in the student edition: the edits quote
the reference."""

from __future__ import annotations

from minivtc.course.edits import Wrong, drop, replace, wrong

__all__ = ["MECHANISMS"]

VTC_FILE, LEAST_FILE = "fairness/vtc.py", "fairness/least_counter.py"
PUSH, LEAST = (LEAST_FILE, "LeastCounter.push"), (LEAST_FILE, "LeastCounter.least")
ENTRY, LIVE = (LEAST_FILE, "LeastCounter.entry"), (LEAST_FILE, "LeastCounter.is_live")
JOIN, FLOOR = (VTC_FILE, "VTC.join"), (VTC_FILE, "VTC.lift_floor")
CHARGE = (VTC_FILE, "VTC.charge")
CHOOSE, DISPLACE = (
    ("engine/preemption.py", "Fair.choose"),
    ("engine/preemption.py", "Fair.displace"),
)
RAN, FAIR_FLOOR = (
    ("fairness/fair_lift.py", "FairLift.ran"),
    ("fairness/fair_lift.py", "FairLift.floor"),
)

A4: list[Wrong] = [
    wrong(
        "a4_vtc",
        "the counter structure never re-keys a charged client (its entry's key is stale)",
        replace(LEAST, "_k != _.counters[_c]", "False"),
    ),
    wrong(
        "a4_vtc",
        "the counter structure breaks ties by when a client joined the queue, not first seen",
        replace(ENTRY, "(_a, _.rank[_c], _n, _c)", "(_a, _n, _n, _c)"),
    ),
    wrong(
        "a4_vtc",
        "an entry stays live after its client's queue empties",
        replace(LIVE, "_a and bool(_q)", "_a"),
    ),
    wrong("a4_vtc", "push forgets the heap", drop(PUSH, "_.heappush(_, _)")),
    wrong(
        "a4_vtc",
        "a client joining Q is never put in the counter structure",
        drop(JOIN, "_.least.push(_)"),
    ),
    wrong(
        "a4_vtc",
        "Q empty: no floor (the last to leave is not the floor)",
        replace(FLOOR, "_.last_left if _c is None else _c", "_c"),
    ),
    wrong("a4b_variants", "charge ignores the weights", replace(CHARGE, "_a / _w", "_a")),
    wrong(
        "a4b_variants",
        "a refund does not re-key the client (its entry stays above its counter)",
        drop(CHARGE, "_.least.push(_)"),
    ),
]
A4B: list[Wrong] = [
    wrong(
        "a4b_variants",
        "the fair victim is the client furthest behind",
        replace(CHOOSE, "max(_a, key=_k)", "min(_a, key=_k)"),
    ),
    wrong(
        "a4b_variants",
        "the fair victim is the oldest request of its client",
        replace(CHOOSE, "reversed(_r)", "_r"),
    ),
    wrong(
        "a4b_variants",
        "displace ignores the gap",
        replace(DISPLACE, "_a > _.gap", "_a > 0"),
    ),
    wrong(
        "a4b_variants",
        "fair preemption's lift can lower a counter (the floor replaced, not raised)",
        replace(FAIR_FLOOR, "_t if _f is None else max(_f, _t)", "_t"),
    ),
    wrong(
        "a4b_variants",
        "nobody is recorded as running while Q is empty",
        drop(RAN, "_.ran_since.update(_)"),
    ),
]
MECHANISMS: list[Wrong] = A4 + A4B
