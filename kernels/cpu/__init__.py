"""C++ kernels for the CPU path, built on first use with the system compiler: bindings.py
builds and loads them; quant.py defines the quantized weight blocks they read."""

from braid.kernels.cpu.bindings import (
    LORA_LINEARS,
    MAX_QUANT_PARTS,
    QUANT_FORMATS,
    CpuKernels,
    QuantDecoderBatch,
    QuantDecoderLayer,
    QuantDecoderShape,
    QuantPart,
    QuantWeight,
    load,
    lora_spans,
    lora_weights,
)

__all__ = [
    "LORA_LINEARS",
    "MAX_QUANT_PARTS",
    "QUANT_FORMATS",
    "CpuKernels",
    "QuantDecoderBatch",
    "QuantDecoderLayer",
    "QuantDecoderShape",
    "QuantPart",
    "QuantWeight",
    "load",
    "lora_spans",
    "lora_weights",
]
