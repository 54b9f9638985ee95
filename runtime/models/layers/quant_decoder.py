"""QuantDecoder: the decoder layers of a model whose linears are all quantized, run for a
whole batch (decode rows, prefill chunks, draft trees) in one call into the CPU kernels
(kernels/cpu/cpu_decoder.cpp).

Batch-1 decoding of the default model's GGUF spends ~8 ms a step in the kernels; calling
them layer by layer from Python added ~3 ms. Every kind of row takes this one call, so a
verification row is computed exactly as a decode row (speculation stays lossless). Batches
with LoRA adapters the kernel cannot update take the layer-by-layer path, whose results this
one reproduces, LoRA updates included: the same C++ kernel adds them after each linear
(runtime/lora/adapter.py's LoraBatch holds the tables).
"""

from __future__ import annotations

import torch

from braid.kernels.cpu import (
    MAX_QUANT_PARTS,
    QUANT_FORMATS,
    QuantDecoderLayer,
    QuantDecoderShape,
    QuantPart,
    QuantWeight,
)
from braid.runtime.attention.cpu_kernels import CpuKernelAttention
from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.models.layers.quantized import QuantLinear, QuantStack


class QuantDecoder:
    def __init__(self, model) -> None:
        """`model`: a LlamaForCausalLM that `QuantDecoder.of` accepted."""
        config = model.config
        self.model = model
        self.attention: CpuKernelAttention = model.ops.attention
        self.shape = QuantDecoderShape(
            hidden=config.hidden_size,
            heads=config.num_heads,
            kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            intermediate=config.intermediate_size,
            eps=config.rms_norm_eps,
            scale=config.head_dim**-0.5,
        )
        # Built on first use, for one pool: pointers into the model's tensors and the pool's.
        self._layers = None
        self._kv: KVPool | None = None

    @classmethod
    def of(cls, model) -> QuantDecoder | None:
        """A QuantDecoder for `model` when every linear of its layers is quantized with the
        CPU kernels behind it, its activations are float32 and its attention is the CPU
        kernels'; else None (the layer-by-layer path serves it)."""
        if not isinstance(model.ops.attention, CpuKernelAttention):
            return None
        if model.config.attention_bias or model.norm.weight.dtype != torch.float32:
            return None
        for layer in model.layers:
            linears = (layer.self_attn.qkv_proj, layer.self_attn.o_proj)
            linears += (layer.mlp.gate_up_proj, layer.mlp.down_proj)
            if not all(_parts(m) for m in linears):
                return None
        return cls(model)

    def serves(self, batch: ForwardBatch) -> bool:
        """Whether the kernels run `batch` whole: no LoRA rows, or those the C++ kernel
        updates (float32 adapters)."""
        return batch.lora is None or batch.lora.cpu_kernels is not None

    def __call__(
        self,
        residual: torch.Tensor,
        batch: ForwardBatch,
        kv: KVPool,
        num_layers: int,
        capture_layers: tuple[int, ...] = (),
        captured: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The first `num_layers` layers over `batch` (which `serves`): `residual` (the
        embeddings) is updated in place; returns the last layer's MLP output. With
        `capture_layers` (as HiddenCapture.layers), the stream entering each of them below
        num_layers is copied into captured[:, c] ([T, len(capture_layers), hidden]; the
        caller adds the last layer's output itself)."""
        meta = batch.metadata(self.attention)
        rotary = self.model.rotary
        lora = batch.lora
        pairs = None if lora is None else (lora.row_adapters, lora.cpu_pairs)
        capture = None
        if capture_layers:
            # A layer past the stack is never reached: -1 matches none.
            which = [j if j < num_layers else -1 for j in capture_layers]
            capture = (torch.tensor(which, dtype=torch.int64), captured)
        return self.attention.lib.quant_decode_layers(
            self._layers_for(kv), num_layers, self.shape, residual, batch.positions,
            batch.out_slots, meta.rows, meta.kv_starts, meta.kv_lens, meta.kv_indices,
            rotary.cos, rotary.sin, pairs, capture,
        )  # fmt: skip

    def _layers_for(self, kv: KVPool):
        if self._kv is not kv:
            if kv.dtype != torch.float32:
                raise ValueError(f"QuantDecoder runs over a float32 KV pool, got {kv.dtype}")
            self._layers = (QuantDecoderLayer * len(self.model.layers))(
                *(_layer(layer, kv) for layer in self.model.layers)
            )
            self._kv = kv
        return self._layers


def _layer(layer, kv: KVPool) -> QuantDecoderLayer:
    attn, mlp = layer.self_attn, layer.mlp

    def weight(linear: QuantLinear | QuantStack) -> QuantWeight:
        parts = [
            QuantPart(p.blocks.data_ptr(), QUANT_FORMATS.index(p.fmt), p.out_features)
            for p in _parts(linear)
        ]
        return QuantWeight((QuantPart * MAX_QUANT_PARTS)(*parts), len(parts))

    def norm(module) -> int | None:
        return module.weight.data_ptr() if module is not None else None

    return QuantDecoderLayer(
        input_norm=norm(layer.input_layernorm),
        post_attention_norm=norm(layer.post_attention_layernorm),
        q_norm=norm(getattr(attn, "q_norm", None)),
        k_norm=norm(getattr(attn, "k_norm", None)),
        qkv=weight(attn.qkv_proj),
        o=weight(attn.o_proj),
        gate_up=weight(mlp.gate_up_proj),
        down=weight(mlp.down_proj),
        k_cache=kv.k[layer.self_attn.layer].data_ptr(),
        v_cache=kv.v[layer.self_attn.layer].data_ptr(),
    )


def _parts(linear) -> list[QuantLinear]:
    """A quantized linear's parts, each with the kernels behind it; [] for anything else."""
    parts = list(linear.parts) if isinstance(linear, QuantStack) else [linear]
    ok = all(isinstance(p, QuantLinear) and p.kernels is not None for p in parts)
    return parts if ok and len(parts) <= MAX_QUANT_PARTS else []
