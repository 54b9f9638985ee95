"""LayerOps: the decoder's small fused operations and its attention, from the backend that
runs them.

On the CPU the C++ kernels (kernels/cpu/cpu.cpp) when they build here, else their torch twins;
on CUDA the twins' torch ops for the norm and the activation, and the Triton kernels for RoPE
with the KV store and for attention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from braid.kernels import cpu, reference
from braid.runtime.attention import AttentionBackend
from braid.runtime.attention.cpu_kernels import CpuKernelAttention
from braid.runtime.attention.torch_paths import TorchAttention
from braid.runtime.attention.triton import TritonAttention


@dataclass(frozen=True)
class LayerOps:
    add_rms_norm: Callable[..., torch.Tensor]  # as kernels.reference.add_rms_norm
    silu_mul: Callable[[torch.Tensor], torch.Tensor]  # as kernels.reference.silu_mul
    attention: AttentionBackend

    @property
    def name(self) -> str:
        return self.attention.name


# The twins: the CPU path without the C++ kernels, and per-head norms on strided views.
TORCH_OPS = LayerOps(reference.add_rms_norm, reference.silu_mul, TorchAttention())
# CUDA: the Triton RoPE + KV store and attention kernels (also runnable in triton's
# interpreter on the CPU, which is how tests run the CUDA path's data flow without a GPU).
TRITON_OPS = LayerOps(reference.add_rms_norm, reference.silu_mul, TritonAttention())


def layer_ops(
    device: torch.device, dtype: torch.dtype, cpu_kernels: bool = True, deterministic: bool = False
) -> LayerOps:
    """`deterministic`: batch-invariant float linears, which need the CPU kernels' attention
    (every row alone, so its sums depend on its own context only)."""
    if device.type == "cuda":
        if deterministic:
            raise ValueError("EngineConfig.deterministic runs on the CPU kernels, not on CUDA")
        return TRITON_OPS
    lib = cpu.load() if cpu_kernels else None
    if lib is not None and lib.supports(dtype):
        attention = CpuKernelAttention(lib)
        return LayerOps(lib.add_rms_norm, lib.silu_mul, attention)
    if deterministic:
        raise ValueError(
            "EngineConfig.deterministic needs the CPU kernels (a C++ compiler, "
            f"cpu_kernels=True, float32 or bfloat16); got cpu_kernels={cpu_kernels}, {dtype}"
        )
    return TORCH_OPS
