"""Attention of a ragged batch of new tokens over their cached prefix and among themselves.

A program takes a block of one sequence's new tokens and one KV head with all the query heads
that share it (GQA): its rows are (token, head) pairs, so each K/V tile is read once per group.
The K/V of the new tokens are read from the pool like the prefix's (store them first), so a
decode row is an extend of length 1 and a hybrid batch is one launch.

Options: a sliding window over positions (a key is seen when the query's position minus the
key's is below `window`; keys wholly before it are skipped), soft-capped scores and attention
sinks (a per-head logit in the softmax's denominator without a value, GPT-OSS: each row's
online softmax starts from it, as from a key scored `sink` whose value is zero).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from braid.kernels.triton.decode import check_sinks, soft_cap


@triton.jit
def _extend_kernel(
    q_ptr,  # [T, H, D]
    k_ptr,  # [S, Hkv, D]
    v_ptr,
    out_ptr,  # [T, H, D]
    qo_indptr_ptr,  # [B + 1]
    kv_indptr_ptr,  # [B + 1]
    kv_indices_ptr,  # [sum L]
    mask_ptr,  # uint8 [sum n * n] when HAS_MASK
    mask_indptr_ptr,  # [B + 1] when HAS_MASK
    pos_ptr,  # [T] the new tokens' positions, when HAS_WINDOW and HAS_MASK
    scale,
    window,  # read when HAS_WINDOW
    softcap,  # read when HAS_SOFTCAP
    sinks_ptr,  # [H] fp32, read when HAS_SINKS
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    first = tl.program_id(1) * BLOCK_M  # the block's first new token within the sequence
    kv_head = tl.program_id(2)
    q_start = tl.load(qo_indptr_ptr + b)
    num_new = tl.load(qo_indptr_ptr + b + 1) - q_start
    if first >= num_new:
        return
    kv_start = tl.load(kv_indptr_ptr + b)
    length = tl.load(kv_indptr_ptr + b + 1) - kv_start
    prefix = length - num_new

    r = tl.arange(0, BLOCK_M * BLOCK_G)  # rows: (token, head in group) pairs
    i = first + r // BLOCK_G  # [R] new-token index
    heads = kv_head * GROUP + r % BLOCK_G
    row_ok = (i < num_new) & (r % BLOCK_G < GROUP)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q = tl.load(
        q_ptr + (q_start + i)[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )  # [R, D]

    if HAS_MASK:
        mask_start = tl.load(mask_indptr_ptr + b)
        end = length
    else:  # causal: the block's last token sees up to itself
        end = prefix + tl.minimum(first + BLOCK_M, num_new)
    lo = 0
    if HAS_WINDOW:
        if HAS_MASK:  # a tree node sits at prefix + its depth, at least prefix
            q_pos = tl.load(pos_ptr + q_start + i, mask=row_ok, other=0)
            lo = tl.maximum(prefix - window + 1, 0)
        else:
            q_pos = prefix + i
            lo = tl.maximum(prefix + first - window + 1, 0)
    m = tl.zeros([BLOCK_M * BLOCK_G], tl.float32) + float("-inf")
    denom = tl.zeros([BLOCK_M * BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_M * BLOCK_G, BLOCK_D], tl.float32)
    if HAS_SINKS:
        m = tl.load(sinks_ptr + heads, mask=row_ok, other=float("-inf"))
        denom = tl.where(row_ok, 1.0, 0.0)
    for start in range(lo, end, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < end
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
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [R, N]
        if HAS_SOFTCAP:
            s = soft_cap(s, softcap)
        j = n[None, :] - prefix  # new-token index of the key; < 0 in the prefix
        if HAS_MASK:
            among_new = (j >= 0) & n_ok[None, :] & row_ok[:, None]
            allowed = tl.load(
                mask_ptr + mask_start + i[:, None] * num_new + j, mask=among_new, other=0
            )
            visible = (j < 0) | (allowed != 0)
        else:
            visible = j <= i[:, None]
        if HAS_WINDOW:
            k_pos = n[None, :]  # a prefix key's (and a causal new token's) position
            if HAS_MASK:
                node = (j >= 0) & n_ok[None, :]
                k_pos = tl.where(node, tl.load(pos_ptr + q_start + j, mask=node, other=0), k_pos)
            visible = visible & (q_pos[:, None] - k_pos < window)
        s = tl.where(visible & n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing yet
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m - m_safe)
        denom = denom * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new

    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    tl.store(
        out_ptr + (q_start + i)[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :],
        out,
        mask=row_ok[:, None] & d_ok[None, :],
    )


def extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
    max_new: int | None = None,
    window: int | None = None,
    softcap: float | None = None,
    positions: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of the new tokens of B sequences over their whole context.

    q: [T, H, D], sequence b's n_b new tokens in rows qo_indptr[b]:qo_indptr[b + 1];
    k_cache, v_cache: [S, Hkv, D]; sequence b's context (prefix, then its new tokens, whose
    K/V are already stored) lives in slots kv_indices[kv_indptr[b]:kv_indptr[b + 1]].
    Every new token sees the whole cached prefix. Among the new tokens, token i sees token j
    when j <= i (causal), or, given `mask`, when mask says so: mask is bool or uint8
    [sum(n_b * n_b)], sequence b's n_b x n_b row-major block after the blocks of the sequences
    before it, entry [i, j] set when new token i may see new token j (a speculative tree's
    ancestor-or-self matrix; set the diagonal). A decode row's block is [[1]].
    `max_new` (max n_b) saves a device read when the caller knows it. `window`: a new token
    at position p sees the keys at positions above p - window (a prefix key's position is its
    index; with `mask`, the new tokens' are `positions` [T], which is then required).
    `softcap`: scores become softcap * tanh(score / softcap). `sinks` (float32 [H]): each
    head's logit added to the softmax's denominator as e^sink. Returns [T, H, D].
    """
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("attention kernels need unit stride along head_dim")
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    check_sinks(sinks, num_heads)
    out = torch.empty_like(q)
    if num_tokens == 0:
        return out
    new_lens = qo_indptr[1:] - qo_indptr[:-1]
    if max_new is None:
        max_new = int(new_lens.max())
    has_mask = mask is not None
    if has_mask:
        mask = mask.contiguous().view(torch.uint8)
        mask_indptr = torch.zeros_like(qo_indptr, dtype=torch.int64)
        torch.cumsum(new_lens * new_lens, 0, out=mask_indptr[1:])
    else:
        mask, mask_indptr = qo_indptr, qo_indptr  # placeholders, never read
    if window is not None and has_mask:
        if positions is None:
            raise ValueError("extend_attention: a window over a tree mask needs positions")
    else:
        positions = qo_indptr  # a placeholder, never read
    block_g = triton.next_power_of_2(group)
    block_m = max(1, 64 // block_g)  # 64 (token, head) rows a program
    block_d = triton.next_power_of_2(head_dim)
    grid = (qo_indptr.numel() - 1, triton.cdiv(max_new, block_m), num_kv_heads)
    _extend_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        qo_indptr,
        kv_indptr,
        kv_indices,
        mask,
        mask_indptr,
        positions,
        scale,
        window or 0,
        softcap or 0.0,
        qo_indptr if sinks is None else sinks,  # a placeholder, never read, without sinks
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        v_cache.stride(0),
        v_cache.stride(1),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        HEAD_DIM=head_dim,
        HAS_MASK=has_mask,
        HAS_WINDOW=window is not None,
        HAS_SOFTCAP=softcap is not None,
        HAS_SINKS=sinks is not None,
        BLOCK_G=block_g,
        BLOCK_M=block_m,
        BLOCK_D=block_d,
        BLOCK_N=64 if block_d <= 128 else 32,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    return out
