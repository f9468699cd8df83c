"""The shared vocabulary at the bottom of the package: a request and its sampling parameters.

Every layer above speaks it: the policies (`fairness/`), the engine, the server, the fleet.
"""
