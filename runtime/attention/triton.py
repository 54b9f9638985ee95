"""TritonAttention: the CUDA path, braid's Triton kernels (braid.kernels).

RoPE and the KV store run in one launch; attention is the split-K decode kernel when every
sequence has one new token, else one extend launch for the whole (possibly hybrid) batch,
draft trees through the extend kernel's mask. Also runs in triton's interpreter on the CPU,
which is how the tests exercise it without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from braid import kernels
from braid.runtime.attention import AttentionBackend
from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.kvcache.pool import KVPool


@dataclass
class TritonMetadata:
    # Sequence b's new tokens are rows qo_indptr[b]:qo_indptr[b + 1], its slots
    # kv_indices[kv_indptr[b]:kv_indptr[b + 1]] (int32 [B + 1], on the batch's device).
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    # The tree masks in the extend kernel's layout: sequence b's [n_b, n_b] block (ancestors,
    # or causal for a plain extend) flattened after those before it; None without trees.
    tree_mask: torch.Tensor | None
    max_new: int  # the most new tokens of a sequence


class TritonAttention(AttentionBackend):
    name = "triton"

    def prepare(self, batch: ForwardBatch) -> TritonMetadata:
        device = batch.input_ids.device
        lens = torch.tensor([batch.extend_lens, batch.seq_lens], dtype=torch.int32)
        indptr = torch.nn.functional.pad(lens.cumsum(1, dtype=torch.int32), (1, 0))
        qo_indptr, kv_indptr = indptr.to(device).unbind(0)
        tree_mask = None
        if any(m is not None for m in batch.tree_masks):
            blocks = [
                torch.ones(n, n, dtype=torch.bool).tril() if m is None else m
                for n, m in zip(batch.extend_lens, batch.tree_masks, strict=True)
            ]
            tree_mask = torch.cat([b.flatten() for b in blocks]).to(device)
        return TritonMetadata(qo_indptr, kv_indptr, tree_mask, max(batch.extend_lens))

    def rope_store_kv(self, *args) -> None:
        kernels.rope_store_kv(*args)  # looked up per call: triton loads on first use

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
        meta = batch.metadata(self)
        k_cache, v_cache = kv.k[layer], kv.v[layer]
        if batch.all_decodes:
            out = kernels.decode_attention(
                q, k_cache, v_cache, meta.kv_indptr, batch.kv_indices, scale, window=window,
                softcap=softcap, sinks=sinks,
            )  # fmt: skip
        else:
            out = kernels.extend_attention(
                q, k_cache, v_cache, meta.qo_indptr, meta.kv_indptr, batch.kv_indices, scale,
                mask=meta.tree_mask, max_new=meta.max_new, window=window, softcap=softcap,
                positions=batch.positions, sinks=sinks,
            )  # fmt: skip
        return out.flatten(1)
