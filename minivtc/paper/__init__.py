"""The paper's experiments, reproduced: `reproduce` writes REPORT.md (`report.py`), with the
figures that are not one workload under several schedulers (`figures.py`).
"""
