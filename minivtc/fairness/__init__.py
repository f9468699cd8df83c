"""The paper's policies, no torch: what is fair and how a scheduler keeps it.

`scheduler.py` (the interface and FCFS), `vtc.py` (Algorithm 2), its family (`policies.py`:
weighted, predicted, profiled; `predictors.py`, `cost.py`), DRR (`drr.py`), the artifact's
variant (`artifact.py`), the least-counter heap and the online check of Lemma 4.3
(`fairness_check.py`). Nothing here imports torch (`tests/test_imports.py`).
"""
