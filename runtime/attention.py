"""Attention over the paged KV pool: the Triton kernels on CUDA, torch ops on the CPU."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

import kernels
from runtime.forward_batch import ForwardBatch
from runtime.kv_cache import KVPool

if TYPE_CHECKING:
    from runtime.models.ops import LayerOps

# Below this many leading slots shared by all decode rows, reading them per row costs less
# than scoring them once for all rows in one matmul.
_MIN_SHARED_PREFIX = 16


def rope_and_attention(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv: KVPool,
    layer: int,
    batch: ForwardBatch,
    scale: float,
    ops: LayerOps,
) -> torch.Tensor:
    """RoPE on the q and k heads of qkv [T, (H + 2 Hkv) * D] (in place), k and v stored into
    the batch's new slots of this layer's pool, then paged_attention. Returns [T, H * D].

    A batch of decodes only, on the CPU kernels, does it all in one call."""
    head_dim = kv.k[layer].shape[-1]
    fused = ops.rope_store_attend
    if fused is not None and batch.all_decodes and _decodes_by_row(batch):
        out = torch.empty(qkv.shape[0], num_heads, head_dim, dtype=qkv.dtype)
        fused(
            qkv, num_heads, num_kv_heads, batch.positions, cos, sin, kv.k[layer], kv.v[layer],
            batch.out_slots, out, batch.decode_rows, batch.decode_kv_starts,
            batch.decode_kv_lens, batch.kv_indices, scale,
        )  # fmt: skip
        return out.flatten(1)
    ops.rope_store_kv(
        qkv, num_heads, num_kv_heads, batch.positions, cos, sin, kv.k[layer], kv.v[layer],
        batch.out_slots,
    )  # fmt: skip
    q = qkv.view(qkv.shape[0], -1, head_dim)[:, :num_heads]  # (T, H, D), tokens strided
    return paged_attention(q, kv, layer, batch, scale, ops)


def _decodes_by_row(batch: ForwardBatch) -> bool:
    """Whether the CPU kernels attend the decode rows one by one, or the torch path scores
    their shared prefix once."""
    return batch.decode_shared_len < _MIN_SHARED_PREFIX


def paged_attention(
    q: torch.Tensor, kv: KVPool, layer: int, batch: ForwardBatch, scale: float, ops: LayerOps
) -> torch.Tensor:
    """Attend each new token to its sequence's context, whose K/V (the new tokens' included)
    are already in the pool: the Triton kernels on CUDA, else the CPU kernels' decode for
    one-token rows (when built) and torch ops for the rest.

    q: [T, H, D] (tokens may be strided, heads packed). Returns [T, H * D].
    """
    if ops.triton_attention:
        return _kernel_attention(q, kv, layer, batch, scale)
    k_cache, v_cache = kv.k[layer], kv.v[layer]
    out = torch.empty(q.shape, dtype=q.dtype)
    by_row = ops.decode_attention
    if by_row is not None and batch.short_rows.numel():
        by_row(
            q, k_cache, v_cache, out, batch.short_rows, batch.short_kv_starts,
            batch.short_kv_lens, batch.kv_indices, scale,
        )  # fmt: skip
    if batch.decode_rows.numel():
        if by_row is not None and _decodes_by_row(batch):
            by_row(
                q, k_cache, v_cache, out, batch.decode_rows, batch.decode_kv_starts,
                batch.decode_kv_lens, batch.kv_indices, scale,
            )  # fmt: skip
        else:
            out[batch.decode_rows] = _decode_attention(
                q[batch.decode_rows], k_cache, v_cache, batch, scale
            )
    if batch.tree_rows.numel():
        out[batch.tree_rows[batch.tree_row_valid]] = _tree_attention(
            q, k_cache, v_cache, batch, scale
        )
    for q_start, n, kv_start, total, short in batch.plain_extends:
        if short and by_row is not None:
            continue  # attended with the decodes above
        slots = batch.kv_indices[kv_start : kv_start + total]
        k_b = k_cache.index_select(0, slots).transpose(0, 1)  # (Hkv, total, D)
        v_b = v_cache.index_select(0, slots).transpose(0, 1)
        # Token i of the new run sits at position total - n + i and sees up to there.
        mask = torch.ones(n, total, dtype=torch.bool, device=q.device).tril(total - n)
        q_b = q[q_start : q_start + n].transpose(0, 1)  # (H, n, D)
        out[q_start : q_start + n] = _grouped_attention(q_b, k_b, v_b, mask, scale).transpose(0, 1)
    return out.flatten(1)


def _kernel_attention(
    q: torch.Tensor, kv: KVPool, layer: int, batch: ForwardBatch, scale: float
) -> torch.Tensor:
    """paged_attention with the Triton kernels: split-K decode when every sequence has one new
    token, else one extend launch for the whole (possibly hybrid) batch; draft trees go
    through the extend kernel's mask."""
    k_cache, v_cache = kv.k[layer], kv.v[layer]
    qo_indptr, kv_indptr = batch.indptr
    if batch.all_decodes:
        out = kernels.decode_attention(q, k_cache, v_cache, kv_indptr, batch.kv_indices, scale)
    else:
        out = kernels.extend_attention(
            q,
            k_cache,
            v_cache,
            qo_indptr,
            kv_indptr,
            batch.kv_indices,
            scale,
            mask=batch.kernel_tree_mask,
            max_new=max(batch.extend_lens),
        )
    return out.flatten(1)


def _grouped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """softmax(q k^T * scale, masked) v with each KV head's query heads grouped.

    q: (..., H, n, D); k, v: (..., Hkv, L, D); mask: bool, broadcastable to (..., n, L).
    Returns (..., H, n, D). On the CPU this is 3-6x faster than SDPA with a mask and
    enable_gqa (its math path, which expands K/V per query head), and 2x faster than einsum
    (measured on this project's CPU machine, bf16).
    """
    *batch, num_heads, n, head_dim = q.shape
    num_kv_heads, length = k.shape[-3], k.shape[-2]
    group = num_heads // num_kv_heads
    q = q.reshape(*batch, num_kv_heads, group * n, head_dim)  # (..., Hkv, G*n, D)
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale  # (..., Hkv, G*n, L)
    scores = scores.view(*batch, num_kv_heads, group, n, length)
    scores.masked_fill_(~mask, float("-inf"))
    probs = scores.softmax(-1).to(v.dtype).view(*batch, num_kv_heads, group * n, length)
    return torch.matmul(probs, v).view(*batch, num_heads, n, head_dim)


def _gather_rows(cache: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """K or V of each row's slots: cache [S, Hkv, D], index [B, L] -> [B, Hkv, L, D].

    index_select over the flattened table is ~9x faster on the CPU than indexing with the
    2-D index, and the head-major copy halves the time of the matmuls that follow.
    """
    rows = cache.index_select(0, index.reshape(-1)).view(index.shape[0], -1, *cache.shape[1:])
    return rows.transpose(1, 2).contiguous()


def _decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: ForwardBatch,
    scale: float,
) -> torch.Tensor:
    """All one-token sequences at once over their padded slot tables. q: (Bd, H, D)."""
    shared = batch.decode_shared_len
    if shared >= _MIN_SHARED_PREFIX:
        return _decode_attention_shared_prefix(q, k_cache, v_cache, batch, scale)
    k = _gather_rows(k_cache, batch.decode_kv_index)  # (Bd, Hkv, L, D)
    v = _gather_rows(v_cache, batch.decode_kv_index)
    valid = batch.decode_kv_valid[:, :, None]  # (Bd, 1, 1, 1, L)
    return _grouped_attention(q.unsqueeze(2), k, v, valid, scale).squeeze(2)


def _tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: ForwardBatch,
    scale: float,
) -> torch.Tensor:
    """All tree extends at once, padded like decode rows: each new token sees its sequence's
    prefix and its own ancestors. q: (T, H, D); returns the real rows, (sum n, H, D)."""
    k = _gather_rows(k_cache, batch.tree_kv_index)  # (Bt, Hkv, L, D)
    v = _gather_rows(v_cache, batch.tree_kv_index)
    q_t = q[batch.tree_rows].transpose(1, 2)  # (Bt, Nmax, H, D) -> (Bt, H, Nmax, D)
    out = _grouped_attention(q_t, k, v, batch.tree_kv_mask, scale)  # (Bt, H, Nmax, D)
    return out.transpose(1, 2)[batch.tree_row_valid]


def _decode_attention_shared_prefix(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: ForwardBatch,
    scale: float,
) -> torch.Tensor:
    """Decode attention when every row starts with the same `shared` slots.

    The shared K/V are gathered once and scored against all rows' queries in one matmul;
    each row's own tail is gathered per row. Both score blocks share one softmax, so the
    result equals attention over the whole context.
    """
    bd, num_heads, head_dim = q.shape
    shared = batch.decode_shared_len
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    prefix = batch.decode_kv_index[0, :shared]
    k_p = k_cache.index_select(0, prefix).transpose(0, 1)  # (Hkv, P, D)
    v_p = v_cache.index_select(0, prefix).transpose(0, 1)
    k_t = _gather_rows(k_cache, batch.decode_kv_index[:, shared:])  # (Bd, Hkv, T, D)
    v_t = _gather_rows(v_cache, batch.decode_kv_index[:, shared:])
    q_g = q.view(bd, num_kv_heads, group, head_dim)  # (Bd, Hkv, G, D)
    # All rows' queries of a KV head against the shared prefix: (Hkv, Bd*G, P).
    q_h = q_g.transpose(0, 1).reshape(num_kv_heads, bd * group, head_dim)
    s_p = torch.matmul(q_h, k_p.transpose(-1, -2)).float() * scale
    s_p = s_p.view(num_kv_heads, bd, group, shared).transpose(0, 1)  # (Bd, Hkv, G, P)
    s_t = torch.matmul(q_g, k_t.transpose(-1, -2)).float() * scale  # (Bd, Hkv, G, T)
    s_t.masked_fill_(~batch.decode_kv_valid[:, :, :, shared:], float("-inf"))
    probs = torch.cat([s_p, s_t], dim=-1).softmax(-1).to(v_t.dtype)
    p_p, p_t = probs.split([shared, probs.shape[-1] - shared], dim=-1)
    p_h = p_p.transpose(0, 1).reshape(num_kv_heads, bd * group, shared)
    out_p = torch.matmul(p_h, v_p).view(num_kv_heads, bd, group, head_dim).transpose(0, 1)
    out = out_p + torch.matmul(p_t, v_t)  # (Bd, Hkv, G, D)
    return out.reshape(bd, num_heads, head_dim)
