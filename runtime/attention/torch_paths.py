"""TorchAttention: paged attention in torch ops, the CPU path without the C++ kernels.

All one-token sequences (decodes) are attended together over padded slot tables, with the
slots every row shares (a common few-shot prompt) scored once for all rows; tree extends
(speculative verification) together likewise, under their ancestor masks; other extends
(prefill chunks) one sequence at a time.

A sliding window narrows each row's slot range (decodes, plain extends) or its mask (trees),
from metadata built once per batch and window; soft-capped scores (Gemma 2) and attention
sinks (GPT-OSS) take one plain path, a masked matmul per sequence (`_attend_each`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from braid.kernels import reference
from braid.runtime.attention import AttentionBackend
from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.kvcache.pool import KVPool

# Below this many leading slots shared by all decode rows, reading them per row costs less
# than scoring them once for all rows in one matmul.
MIN_SHARED_PREFIX = 16


@dataclass
class TorchMetadata:
    # Sequences with one new token: their rows of T, where their slots start in kv_indices
    # and how many there are, their slot tables padded to the longest, and which padded
    # entries are real.
    decode_rows: torch.Tensor  # [Bd]
    decode_kv_starts: torch.Tensor  # [Bd]
    decode_kv_lens: torch.Tensor  # [Bd]
    decode_kv_index: torch.Tensor  # [Bd, Lmax]
    decode_kv_valid: torch.Tensor  # [Bd, 1, 1, Lmax] bool
    # Leading slots every decode sequence shares: their K/V are read once for all rows.
    decode_shared_len: int
    # Tree extends: their rows of T padded to the largest tree, which padded rows are real,
    # their slot tables padded to the longest, and each row's visibility over its padded
    # slot table (prefix and ancestors).
    tree_rows: torch.Tensor  # [Bt, Nmax]
    tree_row_valid: torch.Tensor  # [Bt, Nmax] bool
    tree_kv_index: torch.Tensor  # [Bt, Lmax]
    tree_kv_mask: torch.Tensor  # [Bt, 1, 1, Nmax, Lmax] bool
    # (first row, new tokens, first slot in kv_indices, context) of each other sequence.
    extends: list[tuple[int, int, int, int]]


class TorchAttention(AttentionBackend):
    name = "torch"

    def prepare(self, batch: ForwardBatch, window: int | None = None) -> TorchMetadata:
        """The metadata; with `window`, a decode's slot range and a plain extend's start past
        what no row sees."""
        extend_lens, seq_lens, masks = batch.extend_lens, batch.seq_lens, batch.tree_masks
        kv_starts_list = batch.kv_starts
        row_starts = list(itertools.accumulate(extend_lens, initial=0))
        decodes = [b for b, n in enumerate(extend_lens) if n == 1 and masks[b] is None]
        # Leading slots no new token of sequence b sees (its window's left edge).
        hidden = [0 if window is None else max(0, t - n - window + 1) for t, n in zip(
            seq_lens, extend_lens, strict=True)]  # fmt: skip
        starts = torch.tensor([kv_starts_list[b] + hidden[b] for b in decodes], dtype=torch.int64)
        lens = torch.tensor([seq_lens[b] - hidden[b] for b in decodes], dtype=torch.int64)
        longest = int(lens.max()) if len(decodes) else 0
        kv_index = _padded_tables(batch.kv_indices.cpu(), starts, lens, longest)
        kv_valid = (torch.arange(longest)[None, :] < lens[:, None])[:, None, None, :]
        shared_len = 0
        if len(decodes) > 1:
            same = (kv_index == kv_index[:1]) & kv_valid[:, 0, 0]  # (Bd, Lmax)
            shared_len = int(same.all(0).int().cumprod(0).sum())
        extends = [
            (row_starts[b], n, kv_starts_list[b] + hidden[b], seq_lens[b] - hidden[b])
            for b, n in enumerate(extend_lens)
            if n > 1 and masks[b] is None
        ]
        return TorchMetadata(
            decode_rows=torch.tensor([row_starts[b] for b in decodes], dtype=torch.int64),
            decode_kv_starts=starts,
            decode_kv_lens=lens,
            decode_kv_index=kv_index,
            decode_kv_valid=kv_valid,
            decode_shared_len=shared_len,
            **_tree_tables(batch, row_starts, kv_starts_list, window),
            extends=extends,
        )

    def rope_store_kv(self, *args) -> None:
        reference.rope_store_kv(*args)

    def attend(
        self,
        q: torch.Tensor,
        kv: KVPool,
        layer: int,
        batch: ForwardBatch,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attend each new token to its sequence's context, whose K/V (the new tokens'
        included) are already in the pool. q: [T, H, D] (tokens may be strided, heads
        packed). Returns [T, H * D]."""
        if softcap is not None or sinks is not None:
            return _attend_each(q, kv.k[layer], kv.v[layer], batch, scale, window, softcap, sinks)
        meta = self._metadata(batch, window)
        out = torch.empty(q.shape, dtype=q.dtype)
        self._attend_rows(q, kv, layer, batch, meta, scale, out)
        k_cache, v_cache = kv.k[layer], kv.v[layer]
        if meta.tree_rows.numel():
            out[meta.tree_rows[meta.tree_row_valid]] = _tree_attention(
                q, k_cache, v_cache, meta, scale
            )
        for q_start, n, kv_start, total in meta.extends:
            slots = batch.kv_indices[kv_start : kv_start + total]
            k_b = k_cache.index_select(0, slots).transpose(0, 1)  # (Hkv, total, D)
            v_b = v_cache.index_select(0, slots).transpose(0, 1)
            q_b = q[q_start : q_start + n].transpose(0, 1)  # (H, n, D)
            out[q_start : q_start + n] = causal_attention(q_b, k_b, v_b, scale, window).transpose(
                0, 1
            )
        return out.flatten(1)

    def _attend_rows(self, q, kv, layer, batch, meta: TorchMetadata, scale, out) -> None:
        """The decode rows, all at once over their padded slot tables."""
        if meta.decode_rows.numel():
            out[meta.decode_rows] = _decode_attention(
                q[meta.decode_rows], kv.k[layer], kv.v[layer], meta, scale
            )


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int | None = None
):
    """A run of n new tokens (q: (H, n, D)) over its sequence's L keys (k, v: (Hkv, L, D)),
    the last n of which are its own: token i sees the keys up to L - n + i (and, with a
    `window`, none before L - n + i - window + 1). torch's fused
    attention (a flash kernel on the CPU too, GQA without expanding K/V), several times
    faster on long runs than grouped_attention's matmuls over materialized scores
    (docs/runtime.md)."""
    n, length = q.shape[1], k.shape[1]
    mask = None
    if n != length or (window is not None and length > window):
        # A run after a cached prefix: its queries sit at the bottom right.
        mask = torch.ones(n, length, dtype=torch.bool, device=q.device).tril(length - n)
        if window is not None and length > window:
            mask &= ~torch.ones_like(mask).tril(length - n - window)
    out = F.scaled_dot_product_attention(
        q[None], k[None], v[None], attn_mask=mask, is_causal=mask is None, scale=scale,
        enable_gqa=True,
    )  # fmt: skip
    return out[0]


def grouped_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scale, masked) v with each KV head's query heads grouped.

    q: (..., H, n, D); k, v: (..., Hkv, L, D); mask: bool, broadcastable to (..., n, L).
    `softcap`: scores capped first; `sinks` (float32 [H]): each head's logit joins the
    softmax's denominator without a value. Returns (..., H, n, D). On the CPU this is faster
    than SDPA with a mask and enable_gqa (its math path, which expands K/V per query head) and
    than einsum.
    """
    *batch, num_heads, n, head_dim = q.shape
    num_kv_heads, length = k.shape[-3], k.shape[-2]
    group = num_heads // num_kv_heads
    q = q.reshape(*batch, num_kv_heads, group * n, head_dim)  # (..., Hkv, G*n, D)
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale  # (..., Hkv, G*n, L)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.view(*batch, num_kv_heads, group, n, length)
    scores.masked_fill_(~mask, float("-inf"))
    if sinks is not None:  # one more column per head, dropped after the softmax
        sink = sinks.to(scores.device).view(num_kv_heads, group, 1, 1)
        sink = sink.expand(*scores.shape[:-1], 1)  # (..., Hkv, G, n, 1)
        probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :length]
    else:
        probs = scores.softmax(-1)
    probs = probs.to(v.dtype).reshape(*batch, num_kv_heads, group * n, length)
    return torch.matmul(probs, v).view(*batch, num_heads, n, head_dim)


def _tree_tables(
    batch: ForwardBatch, row_starts: list[int], kv_starts: list[int], window: int | None = None
) -> dict[str, torch.Tensor]:
    """TorchMetadata's tree_* fields: each tree extend's rows of T and slot table, padded to
    the largest, and each row's visibility (its prefix and its ancestors, within `window`)."""
    extend_lens, seq_lens, masks = batch.extend_lens, batch.seq_lens, batch.tree_masks
    trees = [b for b, m in enumerate(masks) if m is not None]
    if not trees:
        return _NO_TREES
    most = max(extend_lens[b] for b in trees)
    widest = max(seq_lens[b] for b in trees)
    rows = torch.zeros(len(trees), most, dtype=torch.int64)
    row_valid = torch.zeros(len(trees), most, dtype=torch.bool)
    kv_index = torch.zeros(len(trees), widest, dtype=torch.int64)
    kv_mask = torch.zeros(len(trees), most, widest, dtype=torch.bool)
    for i, b in enumerate(trees):
        n, total, start = extend_lens[b], seq_lens[b], kv_starts[b]
        rows[i, :n] = torch.arange(row_starts[b], row_starts[b] + n)
        row_valid[i, :n] = True
        kv_index[i, :total] = batch.kv_indices[start : start + total]
        kv_index[i, total:] = batch.kv_indices[start]  # a written slot: see _padded_tables
        kv_mask[i, :n, : total - n] = True
        kv_mask[i, :n, total - n : total] = masks[b]
        if window is not None:
            kv_mask[i, :n, :total] &= _in_window(batch, row_starts[b], n, total, window)
    return {
        "tree_rows": rows,
        "tree_row_valid": row_valid,
        "tree_kv_index": kv_index,
        "tree_kv_mask": kv_mask[:, None, None],
    }


# A batch without trees (only read: attention checks tree_rows.numel()).
_NO_TREES = {
    "tree_rows": torch.zeros(0, 0, dtype=torch.int64),
    "tree_row_valid": torch.zeros(0, 0, dtype=torch.bool),
    "tree_kv_index": torch.zeros(0, 0, dtype=torch.int64),
    "tree_kv_mask": torch.zeros(0, 1, 1, 0, 0, dtype=torch.bool),
}


def _padded_tables(
    kv_indices: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor, width: int
) -> torch.Tensor:
    """[len(starts), width] int64: row i is kv_indices[starts[i] : starts[i] + lens[i]], then
    its last slot repeated. A gather, where copying each row in costs a tensor op per sequence.

    The padding must name written slots: the pool is uninitialised memory, and a masked
    slot's V still enters the matmul with weight 0, where 0 * NaN is NaN."""
    offsets = torch.minimum(torch.arange(width)[None, :], (lens - 1).clamp_min(0)[:, None])
    return kv_indices[starts[:, None] + offsets]


def _gather_rows(cache: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """K or V of each row's slots: cache [S, Hkv, D], index [B, L] -> [B, Hkv, L, D].

    index_select over the flattened table is much faster on the CPU than indexing with the
    2-D index, and the head-major copy speeds up the matmuls that follow.
    """
    rows = cache.index_select(0, index.reshape(-1)).view(index.shape[0], -1, *cache.shape[1:])
    return rows.transpose(1, 2).contiguous()


def _decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: TorchMetadata,
    scale: float,
) -> torch.Tensor:
    """All one-token sequences at once over their padded slot tables. q: (Bd, H, D)."""
    if meta.decode_shared_len >= MIN_SHARED_PREFIX:
        return _decode_attention_shared_prefix(q, k_cache, v_cache, meta, scale)
    k = _gather_rows(k_cache, meta.decode_kv_index)  # (Bd, Hkv, L, D)
    v = _gather_rows(v_cache, meta.decode_kv_index)
    valid = meta.decode_kv_valid[:, :, None]  # (Bd, 1, 1, 1, L)
    return grouped_attention(q.unsqueeze(2), k, v, valid, scale).squeeze(2)


def _tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: TorchMetadata,
    scale: float,
) -> torch.Tensor:
    """All tree extends at once, padded like decode rows: each new token sees its sequence's
    prefix and its own ancestors. q: (T, H, D); returns the real rows, (sum n, H, D)."""
    k = _gather_rows(k_cache, meta.tree_kv_index)  # (Bt, Hkv, L, D)
    v = _gather_rows(v_cache, meta.tree_kv_index)
    q_t = q[meta.tree_rows].transpose(1, 2)  # (Bt, Nmax, H, D) -> (Bt, H, Nmax, D)
    out = grouped_attention(q_t, k, v, meta.tree_kv_mask, scale)  # (Bt, H, Nmax, D)
    return out.transpose(1, 2)[meta.tree_row_valid]


def _decode_attention_shared_prefix(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: TorchMetadata,
    scale: float,
) -> torch.Tensor:
    """Decode attention when every row starts with the same `shared` slots.

    The shared K/V are gathered once and scored against all rows' queries in one matmul;
    each row's own tail is gathered per row. Both score blocks share one softmax, so the
    result equals attention over the whole context.
    """
    bd, num_heads, head_dim = q.shape
    shared = meta.decode_shared_len
    num_kv_heads = k_cache.shape[1]
    group = num_heads // num_kv_heads
    prefix = meta.decode_kv_index[0, :shared]
    k_p = k_cache.index_select(0, prefix).transpose(0, 1)  # (Hkv, P, D)
    v_p = v_cache.index_select(0, prefix).transpose(0, 1)
    k_t = _gather_rows(k_cache, meta.decode_kv_index[:, shared:])  # (Bd, Hkv, T, D)
    v_t = _gather_rows(v_cache, meta.decode_kv_index[:, shared:])
    q_g = q.view(bd, num_kv_heads, group, head_dim)  # (Bd, Hkv, G, D)
    # All rows' queries of a KV head against the shared prefix: (Hkv, Bd*G, P).
    q_h = q_g.transpose(0, 1).reshape(num_kv_heads, bd * group, head_dim)
    s_p = torch.matmul(q_h, k_p.transpose(-1, -2)).float() * scale
    s_p = s_p.view(num_kv_heads, bd, group, shared).transpose(0, 1)  # (Bd, Hkv, G, P)
    s_t = torch.matmul(q_g, k_t.transpose(-1, -2)).float() * scale  # (Bd, Hkv, G, T)
    s_t.masked_fill_(~meta.decode_kv_valid[:, :, :, shared:], float("-inf"))
    probs = torch.cat([s_p, s_t], dim=-1).softmax(-1).to(v_t.dtype)
    p_p, p_t = probs.split([shared, probs.shape[-1] - shared], dim=-1)
    p_h = p_p.transpose(0, 1).reshape(num_kv_heads, bd * group, shared)
    out_p = torch.matmul(p_h, v_p).view(num_kv_heads, bd, group, head_dim).transpose(0, 1)
    out = out_p + torch.matmul(p_t, v_t)  # (Bd, Hkv, G, D)
    return out.reshape(bd, num_heads, head_dim)


def _in_window(batch: ForwardBatch, row: int, n: int, total: int, window: int) -> torch.Tensor:
    """bool [n, total]: which of its sequence's keys each of the n new tokens (rows
    row:row + n of the batch) has within `window` positions, itself included. A key's
    position is its index in the prefix, or for a new token (a tree node) the batch's."""
    q_pos = batch.positions[row : row + n].cpu()
    k_pos = torch.cat([torch.arange(total - n), q_pos])
    return q_pos[:, None] - k_pos[None, :] < window


def _attend_each(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: ForwardBatch,
    scale: float,
    window: int | None,
    softcap: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Every sequence alone, under its causal or tree mask and window, with scores
    soft-capped (Gemma 2) or sinks in the softmax (GPT-OSS): one masked matmul each.
    q: [T, H, D] -> [T, H * D]."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    row = 0
    for n, total, start, tree in zip(
        batch.extend_lens, batch.seq_lens, batch.kv_starts, batch.tree_masks, strict=True
    ):
        slots = batch.kv_indices[start : start + total]
        k = k_cache.index_select(0, slots).transpose(0, 1)  # (Hkv, total, D)
        v = v_cache.index_select(0, slots).transpose(0, 1)
        mask = torch.ones(n, total, dtype=torch.bool).tril(total - n)
        if tree is not None:
            mask[:, total - n :] = tree
        if window is not None:
            mask &= _in_window(batch, row, n, total, window)
        q_b = q[row : row + n].transpose(0, 1)  # (H, n, D)
        o = grouped_attention(q_b, k, v, mask.to(q.device), scale, softcap, sinks)  # (H, n, D)
        out[row : row + n] = o.transpose(0, 1)
        row += n
    return out.flatten(1)
