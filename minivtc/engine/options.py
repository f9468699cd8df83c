"""The engine's options: one frozen, validated value that every front door builds.

Owns `EngineOptions`. The command line (`minivtc serve`, `minivtc simulate`), `LLM(...)`,
`build_engine(...)` and `simulate(...)` all build this one object, so each refusal of a
combination of options ("victim without reservation 'none'", "a nan preempt_gap") is written
once, here, with its message. No I/O, nothing derived from the pool, the model or the policy:
what depends on them is refused where they meet (the default gap, w_q M / 4, is the policy's,
`VTCLedger.set_preempt_gap`; a gap too small for the pool's blocks, `preemption.refuse_thrashing`;
a bound the policy does not state, `fairness_check.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

RESERVATIONS = ("full", "peak", "none")
VICTIMS = ("latest", "fair")
PREEMPTIONS = ("recompute", "swap")


@dataclass(frozen=True)
class EngineOptions:
    """How the engine admits, preempts and checks (Lessons 3 and 10).

    - `reservation`: "full" reserves prompt + max_tokens at admission (Lemma 4.3's proof condition),
      "peak" admits if the batch's peak fits (the artifact's check), "none" allocates blocks
      on demand and preempts a `victim` when they run out (`admission.py`);
    - `victim` (reservation "none"; default "latest", vLLM's): "fair" preempts the client
      with the highest counter, and also displaces one leading a waiting client by more than
      `preempt_gap` (default w_q M / 4; `preemption.Fair`);
    - `preemption` (reservation "none"; default "recompute"): what a victim keeps, nothing
      or, "swap", its keys and values in `swap_tokens` of host memory (default the pool);
    - `admit_every`: admission rounds every this many steps after a successful one (the
      artifact's 10); `max_running`: the most requests in the batch;
    - `check_invariants` (every invariant after every step, for tests) and `check_fairness`
      (the policy's stated bound after every step: `fairness_check.py`).

    None means "not given": an option given where it means nothing is refused, not ignored.
    """

    reservation: str = "full"
    victim: str | None = None
    preempt_gap: float | None = None
    preemption: str | None = None
    swap_tokens: int | None = None
    admit_every: int = 1
    max_running: int = 256
    check_invariants: bool = False
    check_fairness: bool = False

    def __post_init__(self) -> None:
        refuse_unknown("reservation", self.reservation, RESERVATIONS)
        given = [n for n in ("victim", "preempt_gap", "preemption") if getattr(self, n) is not None]
        if self.reservation != "none" and given:
            raise ValueError(
                f"{', '.join(given)} only {'means' if len(given) == 1 else 'mean'} something "
                f"with reservation 'none' (blocks on demand), not {self.reservation!r}"
            )
        if self.victim is not None:
            refuse_unknown("victim", self.victim, VICTIMS)
        if self.preemption is not None:
            refuse_unknown("preemption", self.preemption, PREEMPTIONS)
        if self.preempt_gap is not None:
            if self.victim != "fair":
                raise ValueError("preempt_gap only means something with victim 'fair'")
            if not self.preempt_gap >= 0:  # (nan fails too)
                raise ValueError(
                    f"preempt_gap must be >= 0 (inf: never displace), got {self.preempt_gap}"
                )
        if self.swap_tokens is not None:
            if self.preemption != "swap":
                raise ValueError("swap_tokens only means something with preemption 'swap'")
            if not self.swap_tokens >= 0:
                raise ValueError(f"swap_tokens must be >= 0, got {self.swap_tokens}")
        if self.check_fairness and self.fair_victim and self.admit_every > 1:
            raise ValueError(
                "check_fairness: the preemptive bound needs a displacement round every step; "
                "with admit_every > 1 a client can run ahead of a blocked one unchecked"
            )
        if self.admit_every < 1 or self.max_running < 1:
            raise ValueError(
                f"admit_every and max_running must be >= 1, got {self.admit_every}, "
                f"{self.max_running}"
            )

    @property
    def fair_victim(self) -> bool:
        return self.victim == "fair"

    @property
    def swaps(self) -> bool:
        return self.preemption == "swap"


def refuse_unknown(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        names = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {names}, got {value!r}")
