"""The torch side's model: Llama-2's configuration, forward pass and attention, its weights
(safetensors, Hugging Face layout) and its tokenizer and chat formats.
"""
