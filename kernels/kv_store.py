"""Write the new tokens' K and V into their slots of the paged KV pool, both in one launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    k_ptr,  # [T, Hkv * D] rows
    v_ptr,
    k_cache_ptr,  # [S, Hkv * D] rows
    v_cache_ptr,
    slots_ptr,  # [T]
    num_tokens,
    stride_k,
    stride_v,
    stride_kc,
    stride_vc,
    ROW: tl.constexpr,  # Hkv * D
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = (t < num_tokens)[:, None] & (c < ROW)[None, :]
    slots = tl.load(slots_ptr + t, mask=t < num_tokens, other=0).to(tl.int64)
    k = tl.load(k_ptr + t[:, None] * stride_k + c[None, :], mask=ok)
    v = tl.load(v_ptr + t[:, None] * stride_v + c[None, :], mask=ok)
    dst = slots[:, None]
    tl.store(
        k_cache_ptr + dst * stride_kc + c[None, :], k.to(k_cache_ptr.dtype.element_ty), mask=ok
    )
    tl.store(
        v_cache_ptr + dst * stride_vc + c[None, :], v.to(v_cache_ptr.dtype.element_ty), mask=ok
    )


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Write the new tokens' k, v [T, Hkv, D] into slots [T] of the pool [S, Hkv, D]."""
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("store_kv: the KV pool must be contiguous (it is written through a view)")
    # [N, Hkv, D] -> [N, Hkv * D]: a view when each row's heads are adjacent, else a copy.
    k, v, k_rows, v_rows = k.flatten(1), v.flatten(1), k_cache.flatten(1), v_cache.flatten(1)
    row = k.shape[1]
    block_c = min(triton.next_power_of_2(row), 1024)
    block_t = max(1, 4096 // block_c)
    grid = (triton.cdiv(num_tokens, block_t), triton.cdiv(row, block_c))
    _store_kv_kernel[grid](
        k,
        v,
        k_rows,
        v_rows,
        slots,
        num_tokens,
        k.stride(0),
        v.stride(0),
        k_rows.stride(0),
        v_rows.stride(0),
        ROW=row,
        BLOCK_T=block_t,
        BLOCK_C=block_c,
    )
