"""The core: a Llama-2 engine with a paged KV pool, continuous batching and fair scheduling.

Model side (tensors): `config`, `model`, `attention`, `kv_pool`, `runner`, `sampler`,
`tokenizer`, `weights`, `generate` (the plain one-request loop). Policy side (plain Python,
no torch): `request`, `params`, `scheduler` (FCFS, RPM), `vtc` (VTC and the artifact's),
`predictors`, `policies` (by name), `cost` (h and U), `admission`. `engine` connects them:
the runner is its only door to tensors.
"""
