"""Layers whose weights stay quantized in memory (kernels/cpu/quant.py's blocks).

The CPU kernels read the blocks directly (kernels/cpu/cpu_quant.cpp) once `pack` has laid them
out for them; until then, or without the kernels, the PyTorch twins dequantize on every call
(correct, slow). Activations go in and come out in the model's dtype; the kernels compute in
float32. A bias (GGUF files keep theirs in floats: Qwen2's q/k/v, GPT-OSS's attention) is a
float parameter added to the float32 product.
"""

from __future__ import annotations

import torch
from torch import nn

from braid.kernels import cpu, reference
from braid.kernels.cpu.quant import FORMATS, interleave, interleaved_rows, quantize

# Where the kernels do not round inputs to int8 (no AVX2: they expand blocks and run float
# dot products), from this many input rows (long prefill chunks) a quantized linear expands
# its weight DENSE_CHUNK weights at a time for torch's GEMM instead.
DENSE_MIN_ROWS = 256
DENSE_CHUNK = 1 << 22


class QuantLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, fmt: str, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features, self.fmt = in_features, out_features, fmt
        row_bytes = FORMATS[fmt].row_bytes(in_features)
        # The rows' blocks in order as loaded; after `pack`, interleaved for the kernels.
        self.register_buffer("blocks", torch.empty(out_features, row_bytes, dtype=torch.uint8))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.kernels: cpu.CpuKernels | None = None  # set by `pack`

    @classmethod
    def of(cls, linear: nn.Linear, fmt: str) -> QuantLinear:
        """`linear`'s weight quantized, its bias (if any) kept as it is."""
        layer = cls(linear.in_features, linear.out_features, fmt, linear.bias is not None)
        layer.blocks = quantize(linear.weight, FORMATS[fmt])
        layer.bias = linear.bias
        return layer

    def pack(self) -> None:
        """Hand the blocks to the CPU kernels in their layout (kernels/cpu/quant.py's
        `interleave`), if the kernels can be built here. Done once, when loading is over."""
        kernels = cpu.load()
        if kernels is not None and self.kernels is None:
            self.blocks = interleave(self.blocks, FORMATS[self.fmt], kernels.quant_group)
            self.kernels = kernels

    def take_packed(self, blocks: torch.Tensor, kernels: cpu.CpuKernels) -> None:
        """Blocks already in the kernels' layout (runtime/loading/packed_weights.py mapped them)."""
        rows = interleaved_rows(self.out_features, kernels.quant_group)
        if blocks.shape != (rows, self.blocks.shape[1]):
            raise ValueError(f"packed blocks of shape {tuple(blocks.shape)} for {self}")
        self.blocks, self.kernels = blocks, kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matmul(x.float().contiguous())
        if self.bias is not None:
            y += self.bias
        return y.to(x.dtype)

    def matmul(self, x32: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """float32 x32 [M, K] @ W^T, into `out` (a column slice of a wider output, say) if
        given."""
        k = self.kernels
        if k is None:
            result = reference.quant_matmul(x32, self.blocks, self.fmt)
        elif not k.quant_rounds_inputs and x32.shape[0] >= DENSE_MIN_ROWS:
            result = self._dense(x32)
        else:
            return k.quant_matmul(x32, self.blocks, self.fmt, self.out_features, out)
        if out is None:
            return result
        out.copy_(result)
        return out

    def _dense(self, x32: torch.Tensor) -> torch.Tensor:
        """x32 @ W^T with W expanded to floats DENSE_CHUNK weights at a time, multiplied by
        torch's GEMM."""
        n, k = self.out_features, self.in_features
        rows = max(1, DENSE_CHUNK // k)
        out = torch.empty(x32.shape[0], n, dtype=torch.float32)
        for first in range(0, n, rows):
            ids = torch.arange(first, min(first + rows, n))
            w = self.kernels.dequantize_rows(self.blocks, self.fmt, (n, k), ids)
            torch.mm(x32, w.T, out=out[:, first : first + len(ids)])
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.fmt}"


class QuantStack(nn.Module):
    """A fused linear (q/k/v, gate/up) whose parts are stored in different formats: a GGUF
    "Q4_K_M" file keeps v at more bits than q and k. Each part's output fills its columns; the
    bias, if any, is the fused one."""

    def __init__(self, parts: list[QuantLinear], bias: bool = False) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self.bias = nn.Parameter(torch.empty(self.out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float().contiguous()
        out = torch.empty(x32.shape[0], self.out_features, dtype=torch.float32)
        column = 0
        for part in self.parts:
            part.matmul(x32, out[:, column : column + part.out_features])
            column += part.out_features
        if self.bias is not None:
            out += self.bias
        return out.to(x.dtype)


class QuantEmbedding(nn.Module):
    """A token embedding table kept quantized (tied to a QuantLinear head, say): a lookup
    dequantizes the rows it reads."""

    def __init__(self, table: QuantLinear, dtype: torch.dtype) -> None:
        super().__init__()
        self.table, self.dtype = table, dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = self.table
        if t.kernels is not None:
            shape = (t.out_features, t.in_features)
            rows = t.kernels.dequantize_rows(t.blocks, t.fmt, shape, ids)
        else:
            rows = reference.dequantize(t.blocks[ids], t.fmt, t.in_features)
        return rows.to(self.dtype)
