"""Fair across replicas: one dispatcher holding every tenant's queue and counter in front of
many backends (Appendix C.3's central dispatcher), the simulated fleet and the HTTP gateway.
README: "Fair across replicas"; Lesson 11."""
