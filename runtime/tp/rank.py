"""One rank's share of the model: what it is told to load (RankSpec), what it loads (its
model shard and its share of the KV pool) and what it reports back (RankReport).

Rank 0 (the engine's process) and the worker ranks load through the same function.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from braid.runtime.kvcache.pool import KVPool
from braid.runtime.loading.model_loader import load_model, load_model_config
from braid.runtime.models import LlamaForCausalLM
from braid.runtime.tp.sharding import Shard


@dataclass(frozen=True)
class RankSpec:
    """What a rank loads, and how it reaches the others (sent to each worker at start)."""

    path: Path
    shard: Shard
    dtype: torch.dtype
    device: torch.device  # this rank's own (cuda:N + rank on GPUs)
    num_slots: int  # the same on every rank: rank 0's scheduler hands out slot ids for all
    threads: int  # torch threads of this rank
    cpu_kernels: bool
    deterministic: bool
    quantization: str
    store_path: str  # rank 0's rendezvous store (a file: runtime/tp/group.py)


@dataclass(frozen=True)
class RankReport:
    """What a rank holds, as measured in its own process (the engine lists them as
    `engine.tp_ranks`)."""

    rank: int
    pid: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    kv_shape: tuple[int, ...]  # of each layer's K tensor (and V's): (slots + 1, heads, dim)
    kv_bytes: int  # every K and V tensor of the pool, as allocated

    @classmethod
    def of(cls, rank: int, model: LlamaForCausalLM, kv: KVPool) -> RankReport:
        mc = model.config
        return cls(
            rank=rank,
            pid=os.getpid(),
            num_heads=mc.num_heads,
            num_kv_heads=mc.num_kv_heads,
            intermediate_size=mc.intermediate_size,
            kv_shape=tuple(kv.k[0].shape),
            kv_bytes=sum(t.numel() * t.element_size() for t in kv.k + kv.v),
        )


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank r's device: the CPU for all, or the r-th GPU from the engine's."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", (device.index or 0) + rank)


def load_rank(spec: RankSpec) -> tuple[LlamaForCausalLM, KVPool]:
    """This rank's model shard (not yet summing over the ranks: see sharding.parallelize)
    and its share of the KV pool."""
    mc = load_model_config(spec.path)
    model = load_model(
        spec.path, mc, spec.dtype, spec.device, spec.cpu_kernels, spec.deterministic,
        spec.quantization, shard=spec.shard,
    )  # fmt: skip
    kv = KVPool(
        mc.num_layers, spec.num_slots, spec.shard.num_kv_heads, mc.head_dim, spec.dtype,
        spec.device,
    )  # fmt: skip
    return model, kv
