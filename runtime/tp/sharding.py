"""How a model is split over tensor-parallel ranks (Megatron-style), and the one layer that
sums the ranks' partial outputs.

Each rank holds a contiguous block of KV heads with the query heads they serve (their rows of
q/k/v, their columns of o_proj, their share of the KV pool) and a contiguous block of the
MLP's intermediate features (rows of gate/up, columns of down). Embeddings, norms and the LM
head are whole on every rank. After o_proj and after down_proj each rank holds a partial sum
of the full output; an all-reduce makes it the full output on every rank, so the residual
stream, the norms and the next layer's input are the same everywhere.

Heads are split unevenly when the ranks do not divide them: SmolLM2-135M's 3 KV heads (9
query heads) over 2 ranks are 2 + 1 KV heads (6 + 3 query heads). Splitting by whole KV
heads keeps every rank's query-per-KV-head group the same as the model's, so the attention
kernels run unchanged on a shard; the price is that the largest rank holds ceil(Hkv / tp) of
the KV heads rather than exactly 1 / tp of them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from braid.runtime.models import LlamaForCausalLM, ModelConfig
from braid.runtime.models.layers.quant_decoder import QuantDecoder

# The intermediate features are split in units of this many where they can be: each rank's
# rows of down_proj stay whole blocks of the quantized formats (kernels/cpu/quant.py: 16 and 32
# weights a block) and whole SIMD vectors.
FEATURE_UNIT = 32


@dataclass(frozen=True)
class Shard:
    """What rank `rank` of `world` holds: [first, end) ranges of the model's KV heads, query
    heads and intermediate features."""

    rank: int
    world: int
    kv_heads: tuple[int, int]
    heads: tuple[int, int]
    features: tuple[int, int]

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads[1] - self.kv_heads[0]

    @property
    def num_heads(self) -> int:
        return self.heads[1] - self.heads[0]

    @property
    def intermediate_size(self) -> int:
        return self.features[1] - self.features[0]

    def model_config(self, config: ModelConfig) -> ModelConfig:
        """The config of this rank's model: the whole model's, with its share of the heads and
        features (so the model builds its layers at the shard's sizes)."""
        return dataclasses.replace(
            config,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            intermediate_size=self.intermediate_size,
        )

    def slice_weights(
        self, weights: dict[str, torch.Tensor], head_dim: int
    ) -> dict[str, torch.Tensor]:
        """This rank's part of a transformers checkpoint: rows of the column-parallel linears
        (q/k/v with their biases, gate/up), columns of the row-parallel ones (o, down); the
        rest whole."""
        heads = tuple(h * head_dim for h in self.heads)
        kv_heads = tuple(h * head_dim for h in self.kv_heads)
        rows = {
            "q_proj": heads,
            "k_proj": kv_heads,
            "v_proj": kv_heads,
            "gate_proj": self.features,
            "up_proj": self.features,
        }
        columns = {"o_proj": heads, "down_proj": self.features}
        out = {}
        for name, tensor in weights.items():
            module = name.split(".")[-2]  # model.layers.0.self_attn.q_proj.weight -> q_proj
            if module in rows:
                first, end = rows[module]
                out[name] = tensor[first:end]
            elif module in columns and name.endswith(".weight"):
                first, end = columns[module]
                out[name] = tensor[:, first:end]
            else:
                out[name] = tensor
        return out


def plan_shards(config: ModelConfig, tp: int) -> list[Shard]:
    """One Shard per rank; raises ValueError when `tp` cannot split this model."""
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if tp > config.num_kv_heads:
        raise ValueError(
            f"tp={tp}: the model has {config.num_kv_heads} KV heads ({config.num_heads} query "
            f"heads) and every rank needs at least one KV head; use tp <= {config.num_kv_heads}"
        )
    size = config.intermediate_size
    unit = FEATURE_UNIT if size % FEATURE_UNIT == 0 and size >= tp * FEATURE_UNIT else 1
    group = config.num_heads // config.num_kv_heads  # query heads per KV head
    kv_ranges = _split(config.num_kv_heads, tp, 1)
    feature_ranges = _split(size, tp, unit)
    return [
        Shard(rank, tp, (k0, k1), (k0 * group, k1 * group), features)
        for rank, ((k0, k1), features) in enumerate(zip(kv_ranges, feature_ranges, strict=True))
    ]


def _split(total: int, parts: int, unit: int) -> list[tuple[int, int]]:
    """[first, end) ranges of `total` in whole units, as even as they can be; the first ranges
    take the remainder (rank 0 is never the smaller one, so sizing by it is safe)."""
    units, extra = divmod(total // unit, parts)
    ranges, first = [], 0
    for i in range(parts):
        end = first + (units + (i < extra)) * unit
        ranges.append((first, end))
        first = end
    return ranges


class AllReducer(Protocol):
    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum `tensor` over the ranks, in place."""


class RowParallel(nn.Module):
    """A linear over this rank's slice of the input features: its output is this rank's
    partial sum, which the all-reduce turns into the full output on every rank."""

    def __init__(self, linear: nn.Module, reducer: AllReducer) -> None:
        super().__init__()
        self.linear = linear
        self.reducer = reducer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x).contiguous()  # (T, hidden): collectives take dense tensors
        self.reducer.all_reduce(out)
        return out


def parallelize(model: LlamaForCausalLM, reducer: AllReducer) -> None:
    """Make a shard's model sum its attention and MLP outputs over the ranks."""
    for layer in model.layers:
        layer.self_attn.o_proj = RowParallel(layer.self_attn.o_proj, reducer)
        layer.mlp.down_proj = RowParallel(layer.mlp.down_proj, reducer)
    # The one-call decode stack of a quantized shard would skip the all-reduces: asked
    # again, it declines the RowParallel layers.
    model.decoder = QuantDecoder.of(model)
