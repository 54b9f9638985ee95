"""CpuKernelAttention: the CPU path with the C++ kernels (braid.kernels.cpu).

Every new token is attended alone, as a decode row is: a row reads the ordered list of the
slots it sees (its sequence's prefix, then the new tokens up to itself: for a prefill chunk
the run before it, for a draft tree node its ancestors) and the kernel's sums depend on that
list only. So a token's attention never depends on what else is in the batch, on which kind
of row it is (decode, prefill chunk, speculative verification) or on how its prompt was cut
into chunks, which is what makes the quantized paths batch-invariant and speculation
lossless (docs/runtime.md). The kernels read the pool in place; RoPE, the KV store and the
attention of a whole batch run in one call. Tree rows' slot lists are not runs of the
sequence's table (a node skips its siblings), so they are spelled out after it.

A sliding window starts each row's list at its window's left edge; soft-capped scores and
attention sinks are options of the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from braid.kernels.cpu import CpuKernels
from braid.runtime.attention import AttentionBackend
from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.kvcache.pool import KVPool


@dataclass
class CpuMetadata:
    # Row i of T reads slots kv_indices[kv_starts[i] : kv_starts[i] + kv_lens[i]], in order.
    rows: torch.Tensor  # [T] every row of the batch
    kv_starts: torch.Tensor  # [T]
    kv_lens: torch.Tensor  # [T]
    # The batch's slot tables, then each tree row's own list.
    kv_indices: torch.Tensor


class CpuKernelAttention(AttentionBackend):
    name = "cpu-kernels"

    def __init__(self, lib: CpuKernels) -> None:
        self.lib = lib

    def rope_store_kv(self, *args) -> None:
        self.lib.rope_store_kv(*args)

    def prepare(self, batch: ForwardBatch, window: int | None = None) -> CpuMetadata:
        starts, lens, trees = [], [], []
        tree_at = batch.kv_indices.numel()  # where the next tree row's list goes
        for n, total, start, mask in zip(
            batch.extend_lens, batch.seq_lens, batch.kv_starts, batch.tree_masks, strict=True
        ):
            if mask is None:  # token i of the run sees the prefix and the run up to itself
                starts.append(torch.full((n,), start, dtype=torch.int64))
                lens.append(torch.arange(total - n + 1, total + 1, dtype=torch.int64))
                continue
            table = batch.kv_indices[start : start + total]
            sees = torch.ones(n, total, dtype=torch.bool)
            sees[:, total - n :] = mask  # the prefix, then the node's ancestors and itself
            counts = sees.sum(1)
            trees.append(table.expand(n, total)[sees])
            starts.append(tree_at + torch.cumsum(counts, 0) - counts)
            lens.append(counts)
            tree_at += int(counts.sum())
        kv_starts, kv_lens = torch.cat(starts), torch.cat(lens)
        if window is not None:  # each row's list starts at its window's left edge
            hidden = (kv_lens - window).clamp_min(0)
            kv_starts, kv_lens = kv_starts + hidden, kv_lens - hidden
        kv_indices = torch.cat([batch.kv_indices, *trees]) if trees else batch.kv_indices
        return CpuMetadata(
            rows=torch.arange(kv_starts.numel(), dtype=torch.int64),
            kv_starts=kv_starts,
            kv_lens=kv_lens,
            kv_indices=kv_indices,
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
        head_dim = kv.k[layer].shape[-1]
        out = torch.empty(qkv.shape[0], num_heads, head_dim, dtype=qkv.dtype)
        self.lib.rope_store_attend(
            qkv, num_heads, num_kv_heads, batch.positions, cos, sin, kv.k[layer], kv.v[layer],
            batch.out_slots, out, meta.rows, meta.kv_starts, meta.kv_lens, meta.kv_indices,
            scale, softcap, _float32(sinks),
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
        meta = self._metadata(batch, window)
        out = torch.empty(q.shape, dtype=q.dtype)
        self.lib.decode_attention(
            q, kv.k[layer], kv.v[layer], out, meta.rows, meta.kv_starts, meta.kv_lens,
            meta.kv_indices, scale, softcap, _float32(sinks),
        )  # fmt: skip
        return out.flatten(1)


def _float32(sinks: torch.Tensor | None) -> torch.Tensor | None:
    """The sinks as the kernels read them: float32, contiguous, on the CPU."""
    return None if sinks is None else sinks.detach().float().contiguous().cpu()
