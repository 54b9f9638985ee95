"""LoRA adapters: loading PEFT adapters (adapter.py) and which of them hold their tensors
(memory.py).
"""
