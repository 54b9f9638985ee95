"""RoPE and the KV store in one launch: rotate each new token's q and k heads in place and
write its k and v into their slot of the paged KV pool.

In torch, RoPE alone is several kernels over q and k (two table gathers, casts, the rotation's
products and a concatenation copied back), plus the store; here each token is one program
that reads its heads once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_store_kv_kernel(
    qkv_ptr,  # [T, (H + 2 Hkv) * D], rotated in place
    positions_ptr,  # [T]
    cos_ptr,  # [P, D / 2] fp32
    sin_ptr,
    k_cache_ptr,  # [S, Hkv, D]
    v_cache_ptr,
    slots_ptr,  # [T]
    stride_t,
    stride_p,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,  # >= NUM_HEADS + NUM_KV_HEADS
    BLOCK_KV: tl.constexpr,  # >= NUM_KV_HEADS
    BLOCK_HALF: tl.constexpr,
):
    t = tl.program_id(0)
    pos = tl.load(positions_ptr + t).to(tl.int64)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    d_ok = d < HALF
    c = tl.load(cos_ptr + pos * stride_p + d, mask=d_ok, other=0.0)[None, :]
    s = tl.load(sin_ptr + pos * stride_p + d, mask=d_ok, other=0.0)[None, :]

    # q heads, then k heads: rotated in the half-split layout, in fp32, rounded once.
    h = tl.arange(0, BLOCK_H)
    rotated = h < NUM_HEADS + NUM_KV_HEADS
    ok = rotated[:, None] & d_ok[None, :]
    row = qkv_ptr + t * stride_t + h[:, None] * (2 * HALF) + d[None, :]
    x1 = tl.load(row, mask=ok, other=0.0)
    x2 = tl.load(row + HALF, mask=ok, other=0.0)
    y1 = x1.to(tl.float32) * c - x2.to(tl.float32) * s
    y2 = x2.to(tl.float32) * c + x1.to(tl.float32) * s
    tl.store(row, y1.to(x1.dtype), mask=ok)
    tl.store(row + HALF, y2.to(x1.dtype), mask=ok)

    is_k = (h >= NUM_HEADS) & rotated
    k_ok = is_k[:, None] & d_ok[None, :]
    kv_head = tl.where(is_k, h - NUM_HEADS, 0)
    dst = k_cache_ptr + slot * stride_ks + kv_head[:, None] * stride_kh + d[None, :]
    out_ty = k_cache_ptr.dtype.element_ty
    tl.store(dst, y1.to(out_ty), mask=k_ok)
    tl.store(dst + HALF, y2.to(out_ty), mask=k_ok)

    g = tl.arange(0, BLOCK_KV)
    v_ok = (g < NUM_KV_HEADS)[:, None] & d_ok[None, :]
    v_row = qkv_ptr + t * stride_t + (NUM_HEADS + NUM_KV_HEADS + g[:, None]) * (2 * HALF)
    v_dst = v_cache_ptr + slot * stride_vs + g[:, None] * stride_vh + d[None, :]
    for part in tl.static_range(2):
        v = tl.load(v_row + part * HALF + d[None, :], mask=v_ok)
        tl.store(v_dst + part * HALF, v.to(v_cache_ptr.dtype.element_ty), mask=v_ok)


def rope_store_kv(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Rotate the q and k heads of qkv [T, (H + 2 Hkv) * D] in place (half-split layout, cos
    and sin [P, D / 2] at each token's position), then write its k and v heads into `slots`
    [T] of the pool [S, Hkv, D]. kernels.reference.rope_store_kv is the twin."""
    num_tokens = qkv.shape[0]
    if num_tokens == 0:
        return
    half = cos.shape[-1]
    if qkv.stride(-1) != 1 or cos.stride(-1) != 1 or sin.stride() != cos.stride():
        raise ValueError("rope_store_kv: qkv rows and the cos/sin tables need unit stride")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("rope_store_kv: the KV pool needs unit stride along head_dim")
    _rope_store_kv_kernel[(num_tokens,)](
        qkv,
        positions,
        cos,
        sin,
        k_cache,
        v_cache,
        slots,
        qkv.stride(0),
        cos.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HALF=half,
        BLOCK_H=triton.next_power_of_2(num_heads + num_kv_heads),
        BLOCK_KV=triton.next_power_of_2(num_kv_heads),
        BLOCK_HALF=triton.next_power_of_2(half),
    )
