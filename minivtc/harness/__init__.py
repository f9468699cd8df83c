"""The paper's harness: its workloads (`workloads`), the simulator (`sim`, the engine on a
virtual clock with a `step_time` model), `calibrate`, the paper's metrics (`metrics`, and
`summary` for a run's metrics.json) and the figures (`plots`); the reproduction itself is
`paper/`. Nothing here imports torch but `calibrate`."""
