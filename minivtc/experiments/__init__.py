"""The experiments: the paper's (`paper_table.py` as data, `report.py` running them into
REPORT.md, the figures that are not one workload), and ours (`fair_memory.py`,
`prefix_caching.py`, `across_replicas.py`, `fleet_runs.py`), with their plots and summaries.
Each runs the simulator (`minivtc/sim/`); nothing below imports this folder."""
