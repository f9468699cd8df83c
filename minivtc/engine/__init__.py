"""The engine: a step of continuous batching around a policy (`engine.py`: read `step`
first), the paged KV pool and its admission, preemption, the model runner and sampler,
streaming text, and `factory.build_engine`, the one place an engine is put together.
"""
