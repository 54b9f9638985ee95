"""LayerOps: the decoder's small fused operations, from the backend that runs them.

On the CPU the C++ kernels (kernels/cpu.cpp) when they build here, else their torch twins;
on CUDA the twins' torch ops for the norm and the activation, and the Triton kernels for RoPE
with the KV store and for attention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

import kernels
from kernels import cpu, reference


@dataclass(frozen=True)
class LayerOps:
    add_rms_norm: Callable[..., torch.Tensor]  # as kernels.reference.add_rms_norm
    silu_mul: Callable[[torch.Tensor], torch.Tensor]  # as kernels.reference.silu_mul
    rope_store_kv: Callable[..., None]  # as kernels.reference.rope_store_kv
    # kernels.cpu.CpuKernels.decode_attention (attends rows one by one: decodes, and the
    # tokens of short extends), or None: runtime.attention's torch paths.
    decode_attention: Callable[..., None] | None = None
    # kernels.cpu.CpuKernels.rope_store_attend (rope_store_kv and decode_attention in one
    # call, for batches of decodes only), or None.
    rope_store_attend: Callable[..., None] | None = None
    # Attention through the Triton kernels (kernels.decode_attention / extend_attention)
    # instead of the torch paths.
    triton_attention: bool = False
    name: str = "torch"


# The twins: the CPU path without the C++ kernels, and per-head norms on strided views.
TORCH_OPS = LayerOps(reference.add_rms_norm, reference.silu_mul, reference.rope_store_kv)


def layer_ops(device: torch.device, dtype: torch.dtype, cpu_kernels: bool = True) -> LayerOps:
    if device.type == "cuda":
        return TRITON_OPS
    lib = cpu.load() if cpu_kernels else None
    if lib is not None and lib.supports(dtype):
        return LayerOps(
            lib.add_rms_norm,
            lib.silu_mul,
            lib.rope_store_kv,
            decode_attention=lib.decode_attention,
            rope_store_attend=lib.rope_store_attend,
            name="cpu-kernels",
        )
    return TORCH_OPS


def _triton_rope_store_kv(*args) -> None:
    kernels.rope_store_kv(*args)  # looked up per call: triton loads only when first used


# CUDA: the Triton RoPE + KV store and attention kernels (also runnable in triton's
# interpreter on the CPU, which is how tests run the CUDA path's data flow without a GPU).
TRITON_OPS = LayerOps(
    reference.add_rms_norm,
    reference.silu_mul,
    _triton_rope_store_kv,
    triton_attention=True,
    name="cuda",
)
