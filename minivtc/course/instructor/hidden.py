"""The design assignments' hidden workloads (d1, d2): the seed they are drawn from at grading.

Not in the student edition, so `minivtc course test d1` there runs the public examples
(`graded/design_bench.PUBLIC_SEEDS`) and `minivtc course grade` runs workloads the student has
never seen. Change it each term; the graded tests draw every workload from it, so a grading
is still the same on every run (nothing reads a clock).
"""

__all__ = ["SEED"]

SEED = 20270117
