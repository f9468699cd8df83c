"""The catalogue's wrong solutions of the mechanisms a student writes beside VTC's hooks: a3's
admission round (`admission_round`) and making room (`Engine.make_room`); a4's counter
structure (`LeastCounter`), joining Q, the lift's floor, the charge and each step's charge
(`VTC.on_decode`); a4b's displacement loop (`Engine.make_room`), fair victim
(`preemption.Fair`) and fair preemption's lift (`FairLift`). Written as `wrong.py`'s are
(`edits.py`); each must lose points. Not shipped in the student edition: the edits quote the
reference."""

from __future__ import annotations

from minivtc.course.edits import Wrong, drop, replace, rewrite, wrong

__all__ = ["MECHANISMS"]

VTC_FILE, LEAST_FILE = "fairness/vtc.py", "fairness/least_counter.py"
PUSH, LEAST = (LEAST_FILE, "LeastCounter.push"), (LEAST_FILE, "LeastCounter.least")
ENTRY, LIVE = (LEAST_FILE, "LeastCounter.entry"), (LEAST_FILE, "LeastCounter.is_live")
JOIN, FLOOR = (VTC_FILE, "VTC.join"), (VTC_FILE, "VTC.lift_floor")
CHARGE, ON_DECODE = (VTC_FILE, "VTC.charge"), (VTC_FILE, "VTC.on_decode")
ROUND = ("fairness/scheduler.py", "admission_round")
MAKE_ROOM = ("engine/engine.py", "Engine.make_room")
CHOOSE, DISPLACE = (
    ("engine/preemption.py", "Fair.choose"),
    ("engine/preemption.py", "Fair.displace"),
)
RAN, FAIR_FLOOR = (
    ("fairness/fair_lift.py", "FairLift.ran"),
    ("fairness/fair_lift.py", "FairLift.floor"),
)

PLACED = "if not _p(_r):\n    return _r"  # the round's fit check: place, or stop there
A3: list[Wrong] = [
    wrong(
        "a3_batching",
        "the admission round dispatches without checking the fit (place's answer ignored)",
        rewrite(ROUND, PLACED, "_p(_r)"),
    ),
    wrong(
        "a3_batching",
        "the admission round dispatches a request before placing it",
        rewrite(ROUND, f"{PLACED}\n_s.dispatch(_r)", f"_s.dispatch(_r)\n{PLACED}"),
    ),
    wrong(
        "a3_batching",
        "the admission round skips a request that does not fit to try the next",
        rewrite(ROUND, PLACED, "if not _p(_r):\n    continue"),
    ),
    wrong(
        "a3_batching",
        "the admission round never tells `dispatched` (a check's bookkeeping)",
        drop(ROUND, "if _d is not None:\n    _d(_r)"),
    ),
    wrong(
        "a3_batching",
        "make_room reserves before checking max_running (a request over it keeps its blocks)",
        replace(MAKE_ROOM, "_n >= _m or not _fits", "not _fits or _n >= _m"),
    ),
]
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
    wrong(
        "a4_vtc",
        "on_decode charges a step's tokens only under the lift's condition (fair preemption "
        "on, Q empty)",
        rewrite(
            ON_DECODE,
            "_s.charge_outputs(_r)\nif _c:\n    _b",
            "if _c:\n    _s.charge_outputs(_r)\n    _b",
        ),
    ),
    wrong(
        "a4_vtc",
        "on_decode charges only the first request of the step",
        replace(ON_DECODE, "_s.charge_outputs(_r)", "_s.charge_outputs(_r[:1])"),
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
        "on_decode forgets fair preemption's lift (FairLift never hears who ran)",
        drop(ON_DECODE, "_.fair_lift.ran(_)"),
    ),
    wrong(
        "a4b_variants",
        "on_decode records who ran even while Q holds someone",
        replace(ON_DECODE, "_f is not None and _l is None", "_f is not None"),
    ),
    wrong(
        "a4b_variants",
        "make_room admits past max_running",
        replace(MAKE_ROOM, "_n >= _m or not _fits", "not _fits"),
    ),
    wrong(
        "a4b_variants",
        "make_room preempts without the victim's gap check (choose, not displace)",
        replace(MAKE_ROOM, "_v.displace(_r, _x)", "_v.choose(_x)"),
    ),
    wrong(
        "a4b_variants",
        "make_room admits after one preemption, fitting or not (if, not while)",
        rewrite(MAKE_ROOM, "while _c:\n    _body", "if _c:\n    _body"),
    ),
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
MECHANISMS: list[Wrong] = A3 + A4 + A4B
