"""The paper's harness: its workloads (`workloads`), the simulator (`sim`, the core's engine on
a virtual clock with a `step_time` model), `calibrate`, the paper's metrics (`metrics`), the
figures (`plots`) and the reproduction (`report`). Nothing here imports torch but `calibrate`."""
