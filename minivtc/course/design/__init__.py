"""The design assignments (d1, d2): fair policies for settings the package does not cover.

Each file here is one task, written whole by the student (`quota.py`: quotas per client;
`tenants.py`: tenants of several users). Its docstring states the task and how it is graded:
by properties any right answer has (the quota never exceeded, work conservation, equal shares,
a backlogged gap within the bound the student states) on workloads drawn at grading time from
a seed the student edition does not hold. The instructor's answers and that seed are in
`course/instructor/`, which the edition leaves out; the edition ships each task's docstring
with an empty class (`course/skeletons.py`).
"""
