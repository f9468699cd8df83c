"""Fair across replicas: one dispatcher holding every tenant's queue and counter in front of
many backends (Appendix C.3's central dispatcher) and the simulated fleet; the HTTP gateway
that runs the dispatcher is `gateway/`. minivtc/fleet/README.md; Lesson 14."""
