"""VTC inside vLLM: vLLM's scheduler with its waiting queue kept by minivtc's policies.

`policy_queue.py` (no vLLM needed) translates vLLM's queue calls into the policy interface;
`fair_scheduler.py` plugs it into vLLM (`--scheduler-cls`); `overload.py` runs the paper's
overload workload through vLLM with FCFS and with VTC, and `stand_in.py` on a stand-in for
vLLM's loop (no vLLM needed). How to use it: README.md here.
"""
