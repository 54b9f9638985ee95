"""Triton kernels: paged decode and extend attention, RoPE + KV store, fused sampling, LoRA."""
