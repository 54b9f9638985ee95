"""Split-K (flash-decoding) attention of one new token per sequence over the paged KV pool.

Stage 1 splits each sequence's context into `num_splits` chunks; a program takes one
(sequence, KV head, chunk) and all the query heads that share the KV head (GQA), so each K/V
row is read once per group. It writes the chunk's normalised output and its log-sum-exp.
Stage 2 merges a sequence's chunks by their log-sum-exp weights.

Options: a sliding window (only the `window` latest slots are read), soft-capped scores
(cap * tanh(score / cap), Gemma 2) and attention sinks (a per-head logit in the softmax's
denominator without a value, GPT-OSS: the first chunk counts it, as a key scored `sink` whose
value is zero, so the merge needs nothing of its own).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _decode_split_kernel(
    q_ptr,  # [B, H, D]
    k_ptr,  # [S, Hkv, D]
    v_ptr,
    kv_indptr_ptr,  # [B + 1]
    kv_indices_ptr,  # [sum L]
    part_out_ptr,  # [B, H, NUM_SPLITS, D] fp32
    part_lse_ptr,  # [B, H, NUM_SPLITS] fp32
    scale,
    window,  # read when HAS_WINDOW: the latest slots a token sees, itself included
    softcap,  # read when HAS_SOFTCAP
    sinks_ptr,  # [H] fp32, read when HAS_SINKS
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    kv_start = tl.load(kv_indptr_ptr + b)
    length = tl.load(kv_indptr_ptr + b + 1) - kv_start
    if HAS_WINDOW:  # the slots before the window are skipped, not masked
        hidden = tl.maximum(length - window, 0)
        kv_start += hidden
        length -= hidden
    # Whole blocks per chunk: a short context fills the first splits and leaves the rest empty
    # (cheap) instead of spreading a few tokens over every split; a CUDA graph fixes
    # NUM_SPLITS for contexts of any length.
    chunk = tl.cdiv(tl.cdiv(length, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, length)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + g  # [G]
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=g_ok[:, None] & d_ok[None, :],
        other=0.0,
    )  # [G, D]

    m = tl.zeros([BLOCK_G], tl.float32) + float("-inf")
    denom = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    if HAS_SINKS:  # the first split (never empty: every sequence has a token) counts it
        first = g_ok & (split == 0)
        m = tl.where(first, tl.load(sinks_ptr + heads, mask=g_ok, other=0.0), m)
        denom = tl.where(first, 1.0, denom)
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        slots = tl.load(kv_indices_ptr + kv_start + n, mask=n_ok, other=0).to(tl.int64)
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(
            k_ptr + slots[:, None] * stride_ks + kv_head * stride_kh + d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        v = tl.load(
            v_ptr + slots[:, None] * stride_vs + kv_head * stride_vh + d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [G, N]
        if HAS_SOFTCAP:
            s = soft_cap(s, softcap)
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        denom = denom * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new

    # An empty chunk (a sequence shorter than NUM_SPLITS) gets lse -inf: weight 0 in stage 2.
    empty = lo >= hi
    denom = tl.where(empty, 1.0, denom)
    lse = tl.where(empty, float("-inf"), m + tl.log(denom))
    out = acc / denom[:, None]
    row = (b * GROUP * tl.num_programs(1) + heads) * NUM_SPLITS + split  # [G]
    tl.store(
        part_out_ptr + row[:, None] * HEAD_DIM + d[None, :], out, mask=g_ok[:, None] & d_ok[None, :]
    )
    tl.store(part_lse_ptr + row, lse, mask=g_ok)


@triton.jit
def soft_cap(s, cap):
    """cap * tanh(s / cap), tanh from one exp (stable at both ends)."""
    x = s / cap
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return cap * tl.where(x >= 0, t, -t)


def check_sinks(sinks: torch.Tensor | None, num_heads: int) -> None:
    if sinks is not None and (sinks.dtype != torch.float32 or sinks.shape != (num_heads,)):
        raise ValueError(
            f"attention sinks must be float32 [{num_heads}], got {sinks.dtype} {list(sinks.shape)}"
        )


@triton.jit
def _decode_merge_kernel(
    part_out_ptr,  # [B, H, NUM_SPLITS, D] fp32
    part_lse_ptr,  # [B, H, NUM_SPLITS] fp32
    out_ptr,  # [B, H, D]
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    row = b * tl.num_programs(1) + h
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_ok = s < NUM_SPLITS
    lse = tl.load(part_lse_ptr + row * NUM_SPLITS + s, mask=s_ok, other=float("-inf"))
    part = tl.load(
        part_out_ptr + (row * NUM_SPLITS + s[:, None]) * HEAD_DIM + d[None, :],
        mask=s_ok[:, None] & (d[None, :] < HEAD_DIM),
        other=0.0,
    )  # [S, D]
    w = tl.exp(lse - tl.max(lse, axis=0))  # every sequence has a token: some split is finite
    out = tl.sum(part * w[:, None], axis=0) / tl.sum(w, axis=0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, out, mask=d < HEAD_DIM)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one query token per sequence over its slots in the KV pool.

    q: [B, H, D]; k_cache, v_cache: [S, Hkv, D] (the pool of one layer); sequence b's context
    lives in slots kv_indices[kv_indptr[b]:kv_indptr[b + 1]] (at least one), its new token's
    K/V already stored. Returns [B, H, D] in q's dtype. `num_splits` chunks per sequence
    (default: from the mean context length) only change the speed. `window`: only the last
    `window` slots are seen; `softcap`: scores become softcap * tanh(score / softcap);
    `sinks` (float32 [H]): each head's logit added to the softmax's denominator as e^sink.
    """
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("attention kernels need unit stride along head_dim")
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    check_sinks(sinks, num_heads)
    if num_splits is None:
        # Chunks of >= 256 tokens amortise a chunk's fixed cost; 16 are enough to fill a GPU
        # at batch 1 with 8 KV heads. Shapes only: no wait for the device.
        num_splits = max(1, min(16, kv_indices.numel() // max(batch, 1) // 256))
    part_out = torch.empty(
        batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device
    )
    part_lse = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    if batch == 0:
        return out
    block_d = triton.next_power_of_2(head_dim)
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        kv_indptr,
        kv_indices,
        part_out,
        part_lse,
        scale,
        window or 0,
        softcap or 0.0,
        part_lse if sinks is None else sinks,  # a placeholder, never read, without sinks
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        GROUP=group,
        HEAD_DIM=head_dim,
        NUM_SPLITS=num_splits,
        HAS_WINDOW=window is not None,
        HAS_SOFTCAP=softcap is not None,
        HAS_SINKS=sinks is not None,
        BLOCK_G=max(16, triton.next_power_of_2(group)),  # tl.dot needs 16 rows
        BLOCK_D=block_d,
        BLOCK_N=64 if block_d <= 128 else 32,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    _decode_merge_kernel[(batch, num_heads)](
        part_out,
        part_lse,
        out,
        out.stride(0),
        out.stride(1),
        HEAD_DIM=head_dim,
        NUM_SPLITS=num_splits,
        BLOCK_S=triton.next_power_of_2(num_splits),
        BLOCK_D=block_d,
    )
    return out
