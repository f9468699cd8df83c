"""vLLM's offline API: `LLM(...).generate(...)` and `.chat(...)` over the engine, with vLLM's
arguments, inputs and outputs.
"""
