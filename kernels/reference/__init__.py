"""Plain-PyTorch twins of the kernels: ops.py for the Triton and C++ kernels, sampling.py
for the fused sampling kernel (also the CPU sampler)."""

from braid.kernels.reference.ops import (
    add_rms_norm,
    decode_attention,
    dequantize,
    extend_attention,
    lora_rows,
    lora_segmented,
    quant_matmul,
    quant_matmul_int8,
    rope,
    rope_store_kv,
    silu_mul,
    store_kv,
)
from braid.kernels.reference.sampling import sample

__all__ = [
    "add_rms_norm",
    "decode_attention",
    "dequantize",
    "extend_attention",
    "lora_rows",
    "lora_segmented",
    "quant_matmul",
    "quant_matmul_int8",
    "rope",
    "rope_store_kv",
    "sample",
    "silu_mul",
    "store_kv",
]
