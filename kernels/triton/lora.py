"""LoRA updates of every adapter in a batch in two launches (a segmented matmul, as in
Punica/S-LoRA): rows come in segments of one adapter each, and each program takes a block of
one segment's rows against that adapter's slice of the stacked weights.

Shrink (x @ A.T, rank R) and expand (@ B.T, `out` wide) are separate launches: fused, each
output block would redo the shrink over the whole input width.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _segment_block(segments_ptr, BLOCK_M: tl.constexpr):
    """This program's block of rows: program (segment, block) takes rows block * BLOCK_M on
    of its segment. Returns the block's first row within the segment, the segment's length,
    the rows (int64 offsets into x and y), which of them are in the segment, the adapter."""
    seg = tl.program_id(0)
    first = tl.program_id(1) * BLOCK_M
    start = tl.load(segments_ptr + seg * 3)
    length = tl.load(segments_ptr + seg * 3 + 1)
    adapter = tl.load(segments_ptr + seg * 3 + 2)
    m = first + tl.arange(0, BLOCK_M)
    return first, length, (start + m).to(tl.int64), m < length, adapter


@triton.jit
def _shrink_kernel(
    x_ptr,  # [T, in]
    a_ptr,  # [N, R, in]
    v_ptr,  # [T, R] fp32: x @ A.T of each segment's rows
    segments_ptr,  # [S, 3] (start, length, adapter)
    in_features,
    rank,
    stride_xt,
    stride_an,
    stride_ar,
    stride_vt,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    first, length, rows, row_ok, adapter = _segment_block(segments_ptr, BLOCK_M)
    if first >= length:
        return
    r = tl.arange(0, BLOCK_R)
    r_ok = r < rank
    a_base = a_ptr + adapter.to(tl.int64) * stride_an
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < in_features
        x = tl.load(
            x_ptr + rows[:, None] * stride_xt + k[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )  # [M, K]
        a = tl.load(
            a_base + r[None, :] * stride_ar + k[:, None],
            mask=r_ok[None, :] & k_ok[:, None],
            other=0.0,
        )  # [K, R]
        # Widened: tf32 holds bf16 exactly, so nothing is lost on tensor cores (and triton's
        # interpreter gets a bf16 dot wrong).
        acc += tl.dot(x.to(tl.float32), a.to(tl.float32), input_precision=PRECISION)
    tl.store(
        v_ptr + rows[:, None] * stride_vt + r[None, :], acc, mask=row_ok[:, None] & r_ok[None, :]
    )


@triton.jit
def _expand_kernel(
    v_ptr,  # [T, R] fp32
    b_ptr,  # [N, out, R]
    y_ptr,  # [T, out], added to in place
    segments_ptr,
    out_features,
    rank,
    stride_vt,
    stride_bn,
    stride_bo,
    stride_yt,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    first, length, rows, row_ok, adapter = _segment_block(segments_ptr, BLOCK_M)
    if first >= length:
        return
    r = tl.arange(0, BLOCK_R)
    r_ok = r < rank
    n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < out_features
    v = tl.load(
        v_ptr + rows[:, None] * stride_vt + r[None, :],
        mask=row_ok[:, None] & r_ok[None, :],
        other=0.0,
    )  # [M, R]
    b = tl.load(
        b_ptr + adapter.to(tl.int64) * stride_bn + n[None, :] * stride_bo + r[:, None],
        mask=n_ok[None, :] & r_ok[:, None],
        other=0.0,
    )  # [R, N]
    # v stays fp32 (B is widened, as in the shrink) so the update is rounded once, into y.
    update = tl.dot(v, b.to(tl.float32), input_precision=PRECISION)
    y_ptrs = y_ptr + rows[:, None] * stride_yt + n[None, :]
    ok = row_ok[:, None] & n_ok[None, :]
    y = tl.load(y_ptrs, mask=ok, other=0.0)
    tl.store(y_ptrs, (y.to(tl.float32) + update).to(y.dtype), mask=ok)


def lora_segmented(
    x: torch.Tensor,
    y: torch.Tensor,
    a_stack: torch.Tensor,
    b_stack: torch.Tensor,
    segments: torch.Tensor,
    max_len: int | None = None,
) -> None:
    """y [T, out] += each segment's LoRA update, in place; kernels.reference.lora_segmented
    is the twin and defines the layout. `max_len` (the longest segment) sizes the grid; pass
    it when known to save a device sync."""
    num_segments = segments.shape[0]
    if num_segments == 0:
        return
    if max_len is None:
        max_len = int(segments[:, 1].max())
    if max_len == 0:
        return
    if x.stride(-1) != 1 or y.stride(-1) != 1:
        raise ValueError("lora_segmented: x and y need unit stride along their features")
    if a_stack.stride(-1) != 1 or b_stack.stride(-1) != 1 or not segments.is_contiguous():
        raise ValueError("lora_segmented: A, B and the segments need unit inner stride")
    segments = segments.to(torch.int32)
    in_features, out_features, rank = x.shape[1], y.shape[1], a_stack.shape[1]
    v = torch.empty(x.shape[0], rank, device=x.device, dtype=torch.float32)
    block_m = 16 if max_len <= 16 else 64  # decode segments are a row or a few
    block_r = max(16, triton.next_power_of_2(rank))  # tl.dot needs >= 16 on a GPU
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    grid_m = triton.cdiv(max_len, block_m)
    _shrink_kernel[(num_segments, grid_m)](
        x,
        a_stack,
        v,
        segments,
        in_features,
        rank,
        x.stride(0),
        a_stack.stride(0),
        a_stack.stride(1),
        v.stride(0),
        BLOCK_M=block_m,
        BLOCK_R=block_r,
        BLOCK_K=64,
        PRECISION=precision,
    )
    block_n = 64
    _expand_kernel[(num_segments, grid_m, triton.cdiv(out_features, block_n))](
        v,
        b_stack,
        y,
        segments,
        out_features,
        rank,
        v.stride(0),
        b_stack.stride(0),
        b_stack.stride(1),
        y.stride(0),
        BLOCK_M=block_m,
        BLOCK_R=block_r,
        BLOCK_N=block_n,
        PRECISION=precision,
    )
