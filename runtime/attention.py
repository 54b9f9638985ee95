"""Attention over the paged KV pool, written with torch ops (the CPU path).

The Triton kernels (`kernels.decode_attention`, `kernels.extend_attention`) take the same
ForwardBatch layout on CUDA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.forward_batch import ForwardBatch
from runtime.kv_cache import KVPool


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv: KVPool,
    layer: int,
    batch: ForwardBatch,
    scale: float,
) -> torch.Tensor:
    """Store the new k/v in their slots, then attend each sequence to its whole context.

    q: [T, H, D]; k, v: [T, Hkv, D]. Returns [T, H * D].
    """
    k_cache, v_cache = kv.k[layer], kv.v[layer]
    k_cache.index_copy_(0, batch.out_slots, k)
    v_cache.index_copy_(0, batch.out_slots, v)
    out = torch.empty_like(q)
    if batch.decode_rows.numel():
        out[batch.decode_rows] = _decode_attention(
            q[batch.decode_rows], k_cache, v_cache, batch, scale
        )
    q_start = kv_start = 0
    for n, total in zip(batch.extend_lens, batch.seq_lens, strict=True):
        if n == 1:
            q_start += 1
            kv_start += total
            continue
        slots = batch.kv_indices[kv_start : kv_start + total]
        q_b = q[q_start : q_start + n].transpose(0, 1)  # (H, n, D)
        k_b = k_cache.index_select(0, slots).transpose(0, 1)  # (Hkv, total, D)
        v_b = v_cache.index_select(0, slots).transpose(0, 1)
        mask = None
        if 1 < n < total:
            # Token i of the new run sits at position total - n + i and sees up to there.
            mask = torch.ones(n, total, dtype=torch.bool, device=q.device).tril(total - n)
        o = F.scaled_dot_product_attention(
            q_b,
            k_b,
            v_b,
            attn_mask=mask,
            is_causal=(n == total and n > 1),
            scale=scale,
            enable_gqa=True,
        )
        out[q_start : q_start + n] = o.transpose(0, 1)
        q_start += n
        kv_start += total
    return out.flatten(1)


def _decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: ForwardBatch,
    scale: float,
) -> torch.Tensor:
    """All one-token sequences at once over their padded slot tables. q: (Bd, H, D).

    With no padding (one sequence, or equal lengths) SDPA is fastest. With padding, SDPA's
    masked GQA path is slow on the CPU (its math fallback expands K/V per query head), so
    it is written as two einsums with each KV head's query heads grouped (2x faster in
    bf16 at 64 sequences, measured on this project's CPU machine).
    """
    bd, num_heads, head_dim = q.shape
    # index_select over the flat table: ~9x faster on the CPU than indexing with a 2-D index.
    flat = batch.decode_kv_index.view(-1)
    k = k_cache.index_select(0, flat).view(bd, -1, *k_cache.shape[1:])  # (Bd, L, Hkv, D)
    v = v_cache.index_select(0, flat).view(bd, -1, *v_cache.shape[1:])
    if batch.decode_kv_valid.all():
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2), scale=scale, enable_gqa=True
        )  # (Bd, H, 1, D)
        return out.squeeze(2)
    num_kv_heads = k.shape[2]
    q = q.view(bd, num_kv_heads, num_heads // num_kv_heads, head_dim)  # (Bd, Hkv, G, D)
    scores = torch.einsum("bhgd,blhd->bhgl", q, k).float() * scale
    scores.masked_fill_(~batch.decode_kv_valid, float("-inf"))
    probs = scores.softmax(-1).to(v.dtype)
    out = torch.einsum("bhgl,blhd->bhgd", probs, v)
    return out.reshape(bd, num_heads, head_dim)
