"""Weight-only quantized formats for the CPU kernels (kernels/cpu_quant.cpp), packed from
float weights or converted from a GGUF file's blocks.

q4: 32 weights a block, w = q * scale + min, q in 0..15, scale and min in float16 (5 bits
    a weight: GGUF's Q4_1 block). GGUF's Q4_0 and Q4_1 convert exactly; Q4_K is dequantized
    and packed again (its 6-bit sub-block scales do not survive exactly: the error stays
    under half a step of the new scale).
q8: 16 weights a block, w = q * scale, q in -128..127, scale in float16. GGUF's Q8_0 converts
    exactly; Q6_K is dequantized and packed again (8 bits keep its 6-bit values' precision).

A layer's weight [N, K] is a uint8 tensor [N, K / block * block bytes]: each row's blocks in
order. The CPU kernels read them `interleave`d.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class QuantFormat:
    name: str
    block: int  # weights a block
    dtype: np.dtype  # one block as a numpy record

    @property
    def block_bytes(self) -> int:
        return self.dtype.itemsize

    def row_bytes(self, in_features: int) -> int:
        if in_features % self.block:
            raise ValueError(
                f"{self.name}: rows of {in_features} weights are not whole blocks of {self.block}"
            )
        return in_features // self.block * self.block_bytes


Q4 = QuantFormat("q4", 32, np.dtype([("scale", "<f2"), ("min", "<f2"), ("qs", "u1", 16)]))
Q8 = QuantFormat("q8", 16, np.dtype([("scale", "<f2"), ("qs", "i1", 16)]))
FORMATS = {f.name: f for f in (Q4, Q8)}


def quantize(weight: torch.Tensor, fmt: QuantFormat) -> torch.Tensor:
    """Pack a float weight [N, K] into `fmt`'s blocks (round to nearest)."""
    w = weight.detach().float().cpu().numpy()
    n, k = w.shape
    fmt.row_bytes(k)  # checks whole blocks
    groups = w.reshape(n, k // fmt.block, fmt.block)
    blocks = np.zeros(groups.shape[:2], dtype=fmt.dtype)
    # Scales and mins are stored in float16, rounded outwards (min down, scale up) so each
    # block's grid still covers its weights; the q are rounded against the stored values.
    if fmt is Q4:
        low = _half(groups.min(-1), down=True)
        scale = _half(np.maximum(groups.max(-1) - low, 0) / 15, down=False)
        scale = np.where(scale > 0, scale, np.float16(1))  # a constant block: q = 0
        steps = (groups - low[..., None].astype(np.float32)) / scale[..., None].astype(np.float32)
        q = np.clip(np.rint(steps), 0, 15).astype(np.uint8)
        blocks["scale"], blocks["min"] = scale, low
        blocks["qs"] = q[..., :16] | (q[..., 16:] << 4)
    else:
        scale = _half(np.abs(groups).max(-1) / 127, down=False)
        scale = np.where(scale > 0, scale, np.float16(1))
        blocks["scale"] = scale
        q = np.rint(groups / scale[..., None].astype(np.float32))
        blocks["qs"] = np.clip(q, -128, 127).astype(np.int8)
    return _as_tensor(blocks)


def _half(x: np.ndarray, down: bool) -> np.ndarray:
    """x in float16, rounded down (or up) where it is not exact."""
    half = x.astype(np.float16)
    wrong_side = half.astype(np.float32) > x if down else half.astype(np.float32) < x
    step = np.float16(-np.inf if down else np.inf)
    return np.where(wrong_side, np.nextafter(half, step), half)


GROUP = 8  # rows interleaved together (kernels/cpu_quant.cpp)


def interleaved_rows(n: int) -> int:
    """The rows of an interleaved weight of n rows: n rounded up to whole groups."""
    return -(-n // GROUP) * GROUP


def interleave(blocks: torch.Tensor, fmt: QuantFormat) -> torch.Tensor:
    """`fmt` blocks [N, row bytes] in the CPU kernels' layout: the rows in groups of GROUP
    (the last one padded with zero rows), and for each group and block column its rows'
    scales (then mins), then their quant bytes 4 at a time: bytes 0..3 of each row, then
    bytes 4..7 of each row, and so on. Returns uint8 [N rounded up to GROUP, row bytes]."""
    n, row_bytes = blocks.shape
    padded = interleaved_rows(n)
    rows = np.zeros((padded, row_bytes), np.uint8)
    rows[:n] = blocks.numpy()
    groups = rows.view(fmt.dtype).reshape(padded // GROUP, GROUP, -1).transpose(0, 2, 1)
    g, columns = groups.shape[:2]  # groups [g, block columns, GROUP] records

    def field(name: str) -> np.ndarray:  # [g, columns, bytes]
        return np.ascontiguousarray(groups[name]).view(np.uint8).reshape(g, columns, -1)

    quants = field("qs").reshape(g, columns, GROUP, -1, 4).transpose(0, 1, 3, 2, 4)
    parts = [field(name) for name in fmt.dtype.names if name != "qs"]
    parts.append(quants.reshape(g, columns, -1))
    return torch.from_numpy(np.concatenate(parts, axis=-1).reshape(padded, row_bytes))


def from_gguf(
    data: np.ndarray, ggml_type, shape: tuple[int, int]
) -> tuple[QuantFormat, torch.Tensor]:
    """A GGUF tensor's blocks (uint8 [N, row bytes], logical shape (N, K)) in braid's format:
    the format and the packed weight."""
    import gguf

    t = gguf.GGMLQuantizationType
    n, k = shape
    raw = np.ascontiguousarray(data).reshape(n, -1)
    if ggml_type in (t.Q4_0, t.Q4_1):
        has_min = ggml_type == t.Q4_1
        layout = [("d", "<f2")] + ([("m", "<f2")] if has_min else []) + [("qs", "u1", 16)]
        src = raw.view(np.dtype(layout)).reshape(n, k // 32)
        blocks = np.zeros(src.shape, dtype=Q4.dtype)
        blocks["scale"] = src["d"]
        blocks["min"] = src["m"] if has_min else -8 * src["d"]  # exact in float16
        blocks["qs"] = src["qs"]
        return Q4, _as_tensor(blocks)
    if ggml_type == t.Q8_0:
        src = raw.view(np.dtype([("d", "<f2"), ("qs", "i1", 32)])).reshape(n, k // 32)
        blocks = np.zeros((n, k // 32, 2), dtype=Q8.dtype)  # each GGUF block: two of ours
        blocks["scale"] = src["d"][..., None]
        blocks["qs"] = src["qs"].reshape(n, k // 32, 2, 16)
        return Q8, _as_tensor(blocks.reshape(n, -1))
    if ggml_type in (t.Q4_K, t.Q6_K):
        weight = torch.from_numpy(np.asarray(gguf.quants.dequantize(raw, ggml_type)))
        fmt = Q4 if ggml_type == t.Q4_K else Q8
        return fmt, quantize(weight.reshape(n, k), fmt)
    raise ValueError(f"GGUF tensors of type {ggml_type.name} have no quantized kernel here")


def _as_tensor(blocks: np.ndarray) -> torch.Tensor:
    rows = blocks.shape[0]
    return torch.from_numpy(np.ascontiguousarray(blocks).view(np.uint8).reshape(rows, -1))
