"""Weight-only quantized formats for the CPU kernels (kernels/cpu/cpu_quant.cpp), packed from
float weights or converted from a GGUF file's blocks.

Every block has a float16 scale, and the unsigned formats a float16 min:
q4:  32 weights, w = q * scale + min, q in 0..15 (GGUF's Q4_1 block). From GGUF's Q4_0 and
     Q4_1 exactly; from Q4_K with each 32-weight sub-block's scale and min (d * sc, dmin * m)
     rounded to float16, the q as they are.
q5:  32 weights, w = q * scale + min, q in 0..31: q4's nibbles and the fifth bits. From
     Q5_0, Q5_1 exactly, Q5_K as Q4_K.
q6:  16 weights, w = (q - 32) * scale, q in 0..63: nibbles and two more bits. From Q6_K
     with each 16-weight sub-block's d * sc rounded to float16, the q as they are (7 bits a
     weight, Q6_K's 6.56).
q8:  16 weights, w = q * scale, q in -128..127. From Q8_0 exactly.
iq4: 32 weights, w = IQ4_VALUES[q] * scale, q in 0..15 (GGUF's IQ4_NL block). From IQ4_NL
     exactly; from IQ4_XS with d * (ls - 32) rounded to float16.
mxfp4: 32 weights, w = MXFP4_VALUES[q] * 2^(e - 128), q in 0..15 (GGUF's MXFP4 block: E2M1
     values, doubled to integers, and an E8M0 exponent byte e in place of a float16 scale).
     From MXFP4 exactly, the blocks as stored.
So a GGUF file's weights are kept within float16 rounding of a scale, never requantized.

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
# qh: the fifth bits of weights 4c + k (bit 2c of byte k) and 16 + 4c + k (bit 2c + 1), so
# that the kernels put a 4-byte unit's bits beside its nibbles with one shift.
Q5 = QuantFormat(
    "q5", 32, np.dtype([("scale", "<f2"), ("min", "<f2"), ("qh", "u1", 4), ("qs", "u1", 16)])
)
# qh: the top two bits of weight 4u + k in bits 2u, 2u + 1 of byte k; qs: weight j's low bits
# in the low nibble of byte j, weight 8 + j's in the high one.
Q6 = QuantFormat("q6", 16, np.dtype([("scale", "<f2"), ("qh", "u1", 4), ("qs", "u1", 8)]))
Q8 = QuantFormat("q8", 16, np.dtype([("scale", "<f2"), ("qs", "i1", 16)]))
IQ4 = QuantFormat("iq4", 32, np.dtype([("scale", "<f2"), ("qs", "u1", 16)]))
MXFP4 = QuantFormat("mxfp4", 32, np.dtype([("e", "u1"), ("qs", "u1", 16)]))
FORMATS = {f.name: f for f in (Q4, Q5, Q6, Q8, IQ4, MXFP4)}
# GGUF's IQ4_NL / IQ4_XS levels.
IQ4_VALUES = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8
)
# E2M1's values (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives) doubled, as GGUF stores them;
# the exponent's 2^(e - 127) is halved to match.
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)


def nibbles(q: np.ndarray) -> np.ndarray:
    """n values of 0..15 per block [..., n] as n / 2 bytes: value j in the low nibble of byte
    j, value j + n / 2 in the high one."""
    half = q.shape[-1] // 2
    return (q[..., :half] | (q[..., half:] << 4)).astype(np.uint8)


def fifth_bits(q: np.ndarray) -> np.ndarray:
    """The fifth bits of 32 values of 0..31 per block [..., 32], as Q5's qh [..., 4]."""
    bits = (q >> 4).astype(np.uint8).reshape(*q.shape[:-1], 2, 4, 4)  # [half, c, k]
    shifts = 2 * np.arange(4)[:, None] + np.arange(2)[:, None, None]  # [half, c, 1]
    return np.bitwise_or.reduce(bits << shifts.astype(np.uint8), axis=(-3, -2)).astype(np.uint8)


def quantize(weight: torch.Tensor, fmt: QuantFormat) -> torch.Tensor:
    """Pack a float weight [N, K] into q4 or q8 blocks (round to nearest); the other formats
    only hold a GGUF file's blocks (`from_gguf`)."""
    if fmt not in (Q4, Q8):
        raise ValueError(f"{fmt.name} blocks come from GGUF files only; pack floats as q4 or q8")
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
        blocks["qs"] = nibbles(q)
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


def interleaved_rows(n: int, group: int) -> int:
    """The rows of an interleaved weight of n rows: n rounded up to whole groups."""
    return -(-n // group) * group


def interleave(blocks: torch.Tensor, fmt: QuantFormat, group: int) -> torch.Tensor:
    """`fmt` blocks [N, row bytes] in the CPU kernels' layout: the rows in groups of `group`
    (the kernels' vector width; the last group padded with zero rows), and for each group and
    block column its rows' scales (then mins, then fifth bits), then their quant bytes 4 at a
    time: bytes 0..3 of each row, then bytes 4..7 of each row, and so on. Returns uint8
    [N rounded up to `group`, row bytes]."""
    n, row_bytes = blocks.shape
    padded = interleaved_rows(n, group)
    rows = np.zeros((padded, row_bytes), np.uint8)
    rows[:n] = blocks.numpy()
    groups = rows.view(fmt.dtype).reshape(padded // group, group, -1).transpose(0, 2, 1)
    g, columns = groups.shape[:2]  # groups [g, block columns, group] records

    def field(name: str) -> np.ndarray:  # [g, columns, bytes]
        return np.ascontiguousarray(groups[name]).view(np.uint8).reshape(g, columns, -1)

    quants = field("qs").reshape(g, columns, group, -1, 4).transpose(0, 1, 3, 2, 4)
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
    if ggml_type == t.Q8_0:
        src = _records(raw, [("d", "<f2"), ("qs", "i1", 32)], n, k // 32)
        blocks = np.zeros((n, k // 32, 2), dtype=Q8.dtype)  # each GGUF block: two of ours
        blocks["scale"] = src["d"][..., None]
        blocks["qs"] = src["qs"].reshape(n, k // 32, 2, 16)
        return Q8, _as_tensor(blocks.reshape(n, -1))
    if ggml_type == t.Q6_K:
        q, scale = _q6_k(raw, n, k)
        blocks = np.zeros(scale.shape, dtype=Q6.dtype)
        blocks["scale"] = _to_half(scale)
        blocks["qs"] = nibbles(q & 15)
        top = (q >> 4).reshape(*q.shape[:-1], 4, 4)  # [u, k]: weight 4u + k
        shifts = (2 * np.arange(4, dtype=np.uint8))[:, None]
        blocks["qh"] = np.bitwise_or.reduce(top << shifts, axis=-2)
        return Q6, _as_tensor(blocks)
    if ggml_type in (t.IQ4_NL, t.IQ4_XS):
        if ggml_type == t.IQ4_NL:
            src = _records(raw, [("d", "<f2"), ("qs", "u1", 16)], n, k // 32)
            scale, qs = src["d"], src["qs"]
        else:
            scale, qs = _iq4_xs(raw, n, k)
        blocks = np.zeros(qs.shape[:2], dtype=IQ4.dtype)
        blocks["scale"], blocks["qs"] = _to_half(scale), qs
        return IQ4, _as_tensor(blocks)
    if ggml_type == t.MXFP4:  # the same block, byte for byte
        if raw.nbytes != n * MXFP4.row_bytes(k):  # row_bytes: whole blocks
            raise ValueError(f"MXFP4: {n} rows of {k} weights are {n * MXFP4.row_bytes(k)} bytes")
        return MXFP4, _as_tensor(raw.copy())
    decoders = {
        t.Q4_0: _q4_0, t.Q4_1: _q4_1, t.Q4_K: _q4_k, t.Q5_0: _q5_0, t.Q5_1: _q5_1, t.Q5_K: _q5_k
    }  # fmt: skip
    if ggml_type not in decoders:
        raise ValueError(f"GGUF tensors of type {ggml_type.name} have no quantized kernel here")
    q, scale, low = decoders[ggml_type](raw, n, k)  # w = q * scale + low, 32 a block
    fmt = Q4 if ggml_type in (t.Q4_0, t.Q4_1, t.Q4_K) else Q5
    blocks = np.zeros(scale.shape, dtype=fmt.dtype)
    blocks["scale"], blocks["min"] = _to_half(scale), _to_half(low)
    blocks["qs"] = nibbles(q & 15)
    if fmt is Q5:
        blocks["qh"] = fifth_bits(q)
    return fmt, _as_tensor(blocks)


# GGUF block decoders: (q [N, blocks, 32] uint8, scale [N, blocks], low [N, blocks]) with
# w = q * scale + low, in float32 as gguf's own dequantization computes the factors.


def _records(raw: np.ndarray, layout: list, n: int, blocks: int) -> np.ndarray:
    return raw.view(np.dtype(layout)).reshape(n, blocks)


def _split_nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes [..., 16] -> 32 values: the low nibbles, then the high ones."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _q4_0(raw, n, k):
    src = _records(raw, [("d", "<f2"), ("qs", "u1", 16)], n, k // 32)
    d = src["d"].astype(np.float32)
    return _split_nibbles(src["qs"]), d, -8 * d


def _q4_1(raw, n, k):
    src = _records(raw, [("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)], n, k // 32)
    return _split_nibbles(src["qs"]), src["d"].astype(np.float32), src["m"].astype(np.float32)


def _q5_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's 32 fifth bits (a little-endian uint32 [..., 4 bytes]) as 0 or 16."""
    bits = np.unpackbits(qh, axis=-1, bitorder="little")
    return (bits << 4).astype(np.uint8)


def _q5_0(raw, n, k):
    src = _records(raw, [("d", "<f2"), ("qh", "u1", 4), ("qs", "u1", 16)], n, k // 32)
    d = src["d"].astype(np.float32)
    return _split_nibbles(src["qs"]) | _q5_bits(src["qh"]), d, -16 * d


def _q5_1(raw, n, k):
    layout = [("d", "<f2"), ("m", "<f2"), ("qh", "u1", 4), ("qs", "u1", 16)]
    src = _records(raw, layout, n, k // 32)
    q = _split_nibbles(src["qs"]) | _q5_bits(src["qh"])
    return q, src["d"].astype(np.float32), src["m"].astype(np.float32)


def _k_scales(src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: each 32-weight sub-block's scale and low, [N, blocks * 8]."""
    import gguf

    n, blocks = src.shape
    sc, m = gguf.quants.Q4_K.get_scale_min(src["scales"].reshape(n * blocks, 12))
    d = src["d"].astype(np.float32).reshape(-1, 1)
    dmin = src["dmin"].astype(np.float32).reshape(-1, 1)
    scale = (d * sc.astype(np.float32)).reshape(n, -1)
    return scale, -(dmin * m.astype(np.float32)).reshape(n, -1)


def _k_nibbles(qs: np.ndarray, n: int) -> np.ndarray:
    """Q4_K/Q5_K's 128 bytes a super-block -> [N, sub-blocks, 32]: sub-blocks 2j and 2j + 1
    are the low and the high nibbles of bytes 32j..32j + 31."""
    pairs = qs.reshape(n, -1, 4, 1, 32)
    return np.concatenate([pairs & 15, pairs >> 4], axis=-2).reshape(n, -1, 32)


def _q4_k(raw, n, k):
    layout = [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)]
    src = _records(raw, layout, n, k // 256)
    return (_k_nibbles(src["qs"], n), *_k_scales(src))


def _q5_k(raw, n, k):
    layout = [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qh", "u1", 32),
              ("qs", "u1", 128)]  # fmt: skip
    src = _records(raw, layout, n, k // 256)
    # Sub-block j's fifth bits are bit j of the 32 qh bytes.
    high = (src["qh"][:, :, None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1
    return (_k_nibbles(src["qs"], n) | (high.reshape(n, -1, 32) << 4), *_k_scales(src))


def _q6_k(raw, n, k) -> tuple[np.ndarray, np.ndarray]:
    """(q in 0..63 [N, sub-blocks, 16] (w = (q - 32) * d * sc), d * sc [N, sub-blocks])."""
    layout = [("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")]
    src = _records(raw, layout, n, k // 256)
    # Each half of 128 weights: 64 ql bytes (low nibbles: weights 0..63, high: 64..127) and
    # 32 qh bytes (bits 2t..2t + 1: the top bits of weights 32t..32t + 31).
    ql = src["ql"].reshape(n, -1, 2, 1, 64)
    low = np.concatenate([ql & 15, ql >> 4], axis=-2).reshape(n, -1, 2, 4, 32)
    qh = src["qh"].reshape(n, -1, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8))[:, None]
    q = low | ((qh & 3) << 4)
    scale = src["d"].astype(np.float32)[..., None] * src["scales"].astype(np.float32)
    return q.reshape(n, -1, 16), scale.reshape(n, -1)


def _iq4_xs(raw, n, k) -> tuple[np.ndarray, np.ndarray]:
    """(d * (ls - 32) [N, sub-blocks], the nibbles [N, sub-blocks, 16] as IQ4_NL's)."""
    layout = [("d", "<f2"), ("scales_h", "<u2"), ("scales_l", "u1", 4), ("qs", "u1", 128)]
    src = _records(raw, layout, n, k // 256)
    low = src["scales_l"][..., None] >> np.array([0, 4], dtype=np.uint8)
    high = src["scales_h"][..., None] >> (2 * np.arange(8, dtype=np.uint16))
    ls = (low.reshape(n, -1, 8) & 15) | ((high & 3).astype(np.uint8) << 4)
    scale = src["d"].astype(np.float32)[..., None] * (ls.astype(np.float32) - 32)
    return scale.reshape(n, -1), src["qs"].reshape(n, -1, 16)


def _to_half(x: np.ndarray) -> np.ndarray:
    """A GGUF block's float32 factor in float16: exact for the formats whose factors are
    float16 already, else rounded to nearest (2^-11 relative)."""
    with np.errstate(over="ignore"):
        half = x.astype(np.float16)
    if not np.isfinite(half[np.isfinite(x)]).all():
        raise ValueError("a block scale is out of float16's range (a corrupt GGUF tensor?)")
    return half


def _as_tensor(blocks: np.ndarray) -> torch.Tensor:
    rows = blocks.shape[0]
    return torch.from_numpy(np.ascontiguousarray(blocks).view(np.uint8).reshape(rows, -1))
