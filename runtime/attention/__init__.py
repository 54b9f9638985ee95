"""Attention over the paged KV pool, as backends the model's layers call.

Each backend builds what it needs from a ForwardBatch once per batch (`prepare`, through
`ForwardBatch.metadata`), then per layer `forward` applies RoPE to q and k, stores the new
tokens' K/V into the pool and attends; `attend` is the last part alone.

Three per-layer options: `window`, a sliding window (a token sees the `window` latest
positions, itself included, as transformers' masks; Mistral, Gemma, GPT-OSS), `softcap`,
scores capped as cap * tanh(score / cap) before the softmax (Gemma 2), and `sinks`, float32
[H], each head's learned logit that joins the softmax's denominator and has no value
(GPT-OSS: out = sum_j e^s_j v_j / (sum_j e^s_j + e^sink)). A window hides old keys in the
mask only: their K/V stay in the pool, so prefixes shared through the radix cache stay whole.

- TorchAttention (torch_paths.py): torch ops, the CPU path without the C++ kernels.
- CpuKernelAttention (cpu_kernels.py): the CPU path with braid.kernels.cpu.
- TritonAttention (triton.py): the CUDA path.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.kvcache.pool import KVPool


class AttentionBackend(ABC):
    name: str  # keys the backend's metadata on a batch

    @abstractmethod
    def prepare(self, batch: ForwardBatch) -> Any:
        """What the backend needs from `batch`, beyond the batch itself."""

    def _metadata(self, batch: ForwardBatch, window: int | None) -> Any:
        """The batch's metadata for layers with `window`, from `prepare(batch, window)` (built
        once per batch and window; the plain metadata when no sequence is longer than the
        window)."""
        if window is None or max(batch.seq_lens) <= window:
            return batch.metadata(self)
        key = f"{self.name}/window={window}"
        meta = batch.prepared.get(key)
        if meta is None:
            meta = batch.prepared[key] = self.prepare(batch, window)
        return meta

    @abstractmethod
    def rope_store_kv(self, *args) -> None:
        """As braid.kernels.reference.rope_store_kv."""

    @abstractmethod
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
        """q [T, H, D] (tokens may be strided, heads packed) over K/V already in the pool,
        each new token seeing its sequence's context (within `window`) -> [T, H * D]."""

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
        """RoPE on the q and k heads of qkv [T, (H + 2 Hkv) * D] (in place), k and v stored
        into the batch's new slots of this layer's pool, then `attend`. Returns [T, H * D]."""
        self.rope_store_kv(
            qkv, num_heads, num_kv_heads, batch.positions, cos, sin, kv.k[layer], kv.v[layer],
            batch.out_slots,
        )  # fmt: skip
        head_dim = kv.k[layer].shape[-1]
        q = qkv.view(qkv.shape[0], -1, head_dim)[:, :num_heads]  # (T, H, D), tokens strided
        return self.attend(q, kv, layer, batch, scale, window, softcap, sinks)
