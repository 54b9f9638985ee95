"""CpuKernelAttention: the CPU path with the C++ kernels (braid.kernels.cpu).

Decode rows and the tokens of short extends are attended one row at a time by the kernels'
decode attention, reading the pool in place; a batch of decodes only runs RoPE, the KV store
and attention in one call. Tree extends, long extends and decodes sharing a long prefix take
the torch paths, which do those in a few matmuls. A sliding window moves each row's first
slot and shortens its length (the kernels need no option for it). Soft-capped scores and
attention sinks are options of the kernels: with them, decodes sharing a prefix are attended
row by row too, long extends one masked matmul each, and only batches with tree extends take
the torch path whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from braid.kernels.cpu import CpuKernels
from braid.runtime.attention.torch_paths import (
    MIN_SHARED_PREFIX,
    TorchAttention,
    TorchMetadata,
    grouped_attention,
)
from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.kvcache.pool import KVPool

# Largest plain extend (new tokens x context) attended row by row; past it one matmul per
# sequence costs less.
SHORT_EXTEND_WORK = 8192


@dataclass
class CpuMetadata(TorchMetadata):
    # Short plain extends (a short prompt, a small chunk over a cached prefix): each new
    # token as a row seeing its prefix and the new tokens up to itself.
    short_rows: torch.Tensor  # [Ns] rows of T
    short_kv_starts: torch.Tensor  # [Ns] where each row's slots start in kv_indices
    short_kv_lens: torch.Tensor  # [Ns] how many of them it sees
    # Decodes go to the kernels row by row, unless they share a long prefix (torch scores
    # it once for all rows).
    decodes_by_row: bool


class CpuKernelAttention(TorchAttention):
    name = "cpu-kernels"

    def __init__(self, lib: CpuKernels, rows_only: bool = False) -> None:
        """`rows_only`: every token of every sequence attended row by row, as a decode
        attends it, whatever the batch (deterministic mode)."""
        self.lib = lib
        self.rows_only = rows_only

    def rope_store_kv(self, *args) -> None:
        self.lib.rope_store_kv(*args)

    def _padded_decodes(self, num_decodes: int) -> bool:
        # One decode is attended by row; several are scored together (from padded tables)
        # only when they share a long prefix, which the tables tell.
        return not self.rows_only and num_decodes > 1

    def prepare(self, batch: ForwardBatch, window: int | None = None) -> CpuMetadata:
        short = [
            1 < n and (self.rows_only or n * total <= SHORT_EXTEND_WORK) and m is None
            for n, total, m in zip(batch.extend_lens, batch.seq_lens, batch.tree_masks, strict=True)
        ]
        meta = self._prepare(batch, lambda b: not short[b], window)
        rows, lens, starts, row = [], [], [], 0
        for b, (n, total, start) in enumerate(
            zip(batch.extend_lens, batch.seq_lens, batch.kv_starts, strict=True)
        ):
            if short[b]:
                rows.append(torch.arange(row, row + n))
                lens.append(torch.arange(total - n + 1, total + 1))
                starts.append(torch.full((n,), start))
            row += n
        short_starts, short_lens = _cat_int64(starts), _cat_int64(lens)
        if window is not None:  # each row's slots start at its window's left edge
            hidden = (short_lens - window).clamp_min(0)
            short_starts, short_lens = short_starts + hidden, short_lens - hidden
        return CpuMetadata(
            **vars(meta),
            short_rows=_cat_int64(rows),
            short_kv_starts=short_starts,
            short_kv_lens=short_lens,
            decodes_by_row=self.rows_only or meta.decode_shared_len < MIN_SHARED_PREFIX,
        )

    def forward(
        self,
        qkv: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: KVPool,
        layer: int,
        batch: ForwardBatch,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        meta = self._metadata(batch, window)
        options = softcap is not None or sinks is not None
        if not (batch.all_decodes and (meta.decodes_by_row or options)):
            return super().forward(
                qkv, num_heads, num_kv_heads, cos, sin, kv, layer, batch, scale, window,
                softcap, sinks,
            )  # fmt: skip
        head_dim = kv.k[layer].shape[-1]
        out = torch.empty(qkv.shape[0], num_heads, head_dim, dtype=qkv.dtype)
        self.lib.rope_store_attend(
            qkv, num_heads, num_kv_heads, batch.positions, cos, sin, kv.k[layer], kv.v[layer],
            batch.out_slots, out, meta.decode_rows, meta.decode_kv_starts, meta.decode_kv_lens,
            batch.kv_indices, scale, softcap, _float32(sinks),
        )  # fmt: skip
        return out.flatten(1)

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
        if softcap is None and sinks is None:
            return super().attend(q, kv, layer, batch, scale, window)
        meta = self._metadata(batch, window)
        if meta.tree_rows.numel():  # trees (speculative verification): torch's masked matmuls
            return super().attend(q, kv, layer, batch, scale, window, softcap, sinks)
        # Every decode and short extend by row (the torch path's shared-prefix decodes have
        # no options), each long extend in one masked matmul.
        out = torch.empty(q.shape, dtype=q.dtype)
        sinks = _float32(sinks)
        self._kernel_rows(q, kv, layer, batch, meta, scale, out, softcap, sinks, decodes=True)
        k_cache, v_cache = kv.k[layer], kv.v[layer]
        for q_start, n, kv_start, total in meta.extends:
            slots = batch.kv_indices[kv_start : kv_start + total]
            k_b = k_cache.index_select(0, slots).transpose(0, 1)  # (Hkv, total, D)
            v_b = v_cache.index_select(0, slots).transpose(0, 1)
            q_b = q[q_start : q_start + n].transpose(0, 1)  # (H, n, D)
            # Row i sees keys up to total - n + i, and within the window (the slots no row
            # sees are cut off already).
            mask = torch.ones(n, total, dtype=torch.bool).tril(total - n)
            if window is not None:
                mask &= ~torch.ones_like(mask).tril(total - n - window)
            o = grouped_attention(q_b, k_b, v_b, mask, scale, softcap, sinks)  # (H, n, D)
            out[q_start : q_start + n] = o.transpose(0, 1)
        return out.flatten(1)

    def _attend_rows(self, q, kv, layer, batch, meta: CpuMetadata, scale, out) -> None:
        self._kernel_rows(q, kv, layer, batch, meta, scale, out, None, None, meta.decodes_by_row)
        if meta.decode_rows.numel() and not meta.decodes_by_row:
            super()._attend_rows(q, kv, layer, batch, meta, scale, out)

    def _kernel_rows(
        self, q, kv, layer, batch, meta: CpuMetadata, scale, out, softcap, sinks, decodes: bool
    ) -> None:
        """The short extends' rows, and the decode rows if `decodes`, by the kernels."""
        k_cache, v_cache = kv.k[layer], kv.v[layer]
        parts = [(meta.short_rows, meta.short_kv_starts, meta.short_kv_lens)]
        if decodes:
            parts.append((meta.decode_rows, meta.decode_kv_starts, meta.decode_kv_lens))
        for rows, starts, lens in parts:
            if rows.numel():
                self.lib.decode_attention(
                    q, k_cache, v_cache, out, rows, starts, lens, batch.kv_indices, scale,
                    softcap, sinks,
                )  # fmt: skip


def _float32(sinks: torch.Tensor | None) -> torch.Tensor | None:
    """The sinks as the kernels read them: float32, contiguous, on the CPU."""
    return None if sinks is None else sinks.detach().float().contiguous().cpu()


def _cat_int64(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts).to(torch.int64) if parts else torch.empty(0, dtype=torch.int64)
