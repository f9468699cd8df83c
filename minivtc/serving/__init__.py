"""Serving: the engine on its own thread (`engine_loop`), the OpenAI-compatible server
(`server`, with `openai_api`, `api_keys`, `middleware`, `observability` over a `snapshot`), a
load generator (`loadgen`) and the demo (`demo`). A thin layer: nothing here decides who runs
next."""
