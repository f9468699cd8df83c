"""The design assignments' hidden workloads (d1, d2): the seed they are drawn from at grading.

Not in the student edition, so `minivtc course test d1` there runs the public examples
(`graded/design_bench.PUBLIC_SEEDS`) and `minivtc course grade` runs workloads the student has
never seen. `DEFAULT_SEED` is committed with the repository, so it is public wherever the
repository is: an instructor sets their own secret seed in the environment variable
`MINIVTC_HIDDEN_SEED` (an integer) where `course grade` runs, a new one each term, without
editing the package; CI leaves it unset and grades on the default. The graded tests draw every
workload from the seed, so a grading is still the same on every run (nothing reads a clock).
The variable is read on the tests' side only: the sandbox the student's code runs in gets
none of the grader's environment (`sandbox.environment`).
"""

from __future__ import annotations

import os

__all__ = ["DEFAULT_SEED", "SEED_VARIABLE", "seed"]

SEED_VARIABLE = "MINIVTC_HIDDEN_SEED"
DEFAULT_SEED = 20270117


def seed() -> int:
    """The hidden seed: `MINIVTC_HIDDEN_SEED` where it is set, else `DEFAULT_SEED`."""
    text = os.environ.get(SEED_VARIABLE, "").strip()
    if not text:
        return DEFAULT_SEED
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{SEED_VARIABLE} must be an integer, not {text!r}") from None
