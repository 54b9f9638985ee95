"""Layers whose weights stay quantized in memory (kernels/quant.py's q4 and q8 blocks).

The CPU kernels read the blocks directly (kernels/cpu_quant.cpp); without them the PyTorch
twins dequantize on every call (correct, slow). Activations go in and come out in the
model's dtype; the kernels compute in float32.
"""

from __future__ import annotations

import torch
from torch import nn

from braid.kernels import cpu, reference
from braid.kernels.quant import FORMATS, quantize


class QuantLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, fmt: str) -> None:
        super().__init__()
        self.in_features, self.out_features, self.fmt = in_features, out_features, fmt
        row_bytes = FORMATS[fmt].row_bytes(in_features)
        self.register_buffer("blocks", torch.empty(out_features, row_bytes, dtype=torch.uint8))
        self.kernels = cpu.load()

    @classmethod
    def of(cls, linear: nn.Linear, fmt: str) -> QuantLinear:
        """`linear`'s weight quantized (a linear with a bias has no quantized kernel)."""
        if linear.bias is not None:
            raise ValueError("quantized linears take no bias")
        layer = cls(linear.in_features, linear.out_features, fmt)
        layer.blocks = quantize(linear.weight, FORMATS[fmt])
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float().contiguous()
        if self.kernels is not None:
            out = self.kernels.quant_matmul(x32, self.blocks, self.fmt)
        else:
            out = reference.quant_matmul(x32, self.blocks, self.fmt)
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.fmt}"


class QuantEmbedding(nn.Module):
    """A token embedding table kept quantized (tied to a QuantLinear head, say): a lookup
    dequantizes the rows it reads."""

    def __init__(self, table: QuantLinear, dtype: torch.dtype) -> None:
        super().__init__()
        self.table, self.dtype = table, dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = self.table
        if t.kernels is not None:
            rows = t.kernels.dequantize_rows(t.blocks, t.fmt, t.in_features, ids)
        else:
            rows = reference.dequantize(t.blocks[ids], t.fmt, t.in_features)
        return rows.to(self.dtype)
