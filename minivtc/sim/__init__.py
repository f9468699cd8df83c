"""The simulator: the real engine on a virtual clock (`simulator.py`) with a step-time model
(`step_time.py`, fitted by `calibrate.py`), the paper's workloads (`workloads.py`) and its
metrics (`metrics.py`, and `backlog.py`'s Theorem 4.4 gap). Core: no experiment lives here."""
