"""Gemma 2 and Gemma 3 (text), our own forward.

What sets them apart from the Llama shape (transformers' modeling_gemma2.py and
modeling_gemma3.py are the reference, to the order of the casts):
- the embedding is scaled by sqrt(hidden) (rounded to the weights' dtype);
- RMSNorm multiplies by (1 + w), in float32, and each layer normalises the attention and MLP
  outputs too (post norms) before they join the residual stream;
- the MLP is GeGLU (gelu, tanh approximation);
- attention scores are scaled by query_pre_attn_scalar ** -0.5; Gemma 2 soft-caps them (and
  the final logits) as cap * tanh(x / cap); Gemma 3 RMS-normalises q and k per head;
- local layers attend within a sliding window (ModelConfig.layer_windows) and, in Gemma 3,
  rotate with their own rope base (ModelConfig.local_rope_parameters).

The weights' names are transformers', so LlamaForCausalLM's loader and materialize serve.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.models.config.model_config import ModelConfig
from braid.runtime.models.layers.ops import TORCH_OPS, LayerOps
from braid.runtime.models.llama import MLP, Attention, LlamaForCausalLM, Rotary


class GemmaRMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * (1 + w), computed in float32, cast back to x's dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)


class GemmaRotary(nn.Module):
    """The cos/sin tables of the full layers and, where they differ (Gemma 3), the local
    layers'; `reset` recomputes both, as the loaders do for `model.rotary`."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.full = Rotary(config)
        self.local = self.full
        if config.local_rope_parameters is not None:
            local = dataclasses.replace(config, rope_parameters=config.local_rope_parameters)
            self.local = Rotary(local)

    def reset(self) -> GemmaRotary:
        self.full.reset()
        if self.local is not self.full:
            self.local.reset()
        return self

    def of(self, window: int | None) -> Rotary:
        return self.full if window is None else self.local


class GemmaAttention(Attention):
    """Llama's attention with Gemma's (1 + w) q/k norms, query_pre_attn_scalar's scale,
    soft-capped scores (Gemma 2) and the local layers' own rope (Gemma 3)."""

    def __init__(self, config: ModelConfig, layer: int, linear: type[nn.Linear]) -> None:
        super().__init__(config, layer, linear)
        if config.qk_norm:
            self.q_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
        self.scale = config.query_pre_attn_scalar**-0.5
        self.softcap = config.attn_logit_softcapping

    def rope_tables(self, rotary: GemmaRotary) -> tuple[torch.Tensor, torch.Tensor]:
        rot = rotary.of(self.window)
        return rot.cos, rot.sin

    def normalize_qk(self, qkv: torch.Tensor) -> None:
        if self.qk_norm:
            heads = qkv.view(qkv.shape[0], -1, self.head_dim)  # (T, H + 2 Hkv, D)
            q, k = heads[:, : self.num_heads], heads[:, self.num_heads : -self.num_kv_heads]
            q.copy_(self.q_norm(q))
            k.copy_(self.k_norm(k))


class GemmaMLP(MLP):
    def activation(self, gate_up: torch.Tensor, ops: LayerOps) -> torch.Tensor:
        """GeGLU: gelu_tanh(gate) * up."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, linear: type[nn.Linear]) -> None:
        super().__init__()
        dim, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(dim, eps)
        self.self_attn = GemmaAttention(config, layer, linear)
        self.post_attention_layernorm = GemmaRMSNorm(dim, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(dim, eps)
        self.mlp = GemmaMLP(config, layer, linear)
        self.post_feedforward_layernorm = GemmaRMSNorm(dim, eps)

    def forward(
        self, x: torch.Tensor, batch: ForwardBatch, kv: KVPool, rotary: GemmaRotary, ops: LayerOps
    ) -> torch.Tensor:
        """x (T, hidden), the residual stream -> the stream after this layer."""
        h = self.self_attn(self.input_layernorm(x), batch, kv, rotary, ops)
        x = x + self.post_attention_layernorm(h)
        h = self.mlp(self.pre_feedforward_layernorm(x), batch, ops)
        return x + self.post_feedforward_layernorm(h)


class GemmaForCausalLM(LlamaForCausalLM):
    """Gemma 2 and 3 behind LlamaForCausalLM's interface (loading, materialize, forward's
    arguments); its layers are its own. The fused decode kernel (quant_decoder.py) is the
    Llama shape's and is never used here."""

    def __init__(self, config: ModelConfig, linear: type[nn.Linear] = nn.Linear) -> None:
        nn.Module.__init__(self)
        self.config = config
        weight = torch.empty(config.vocab_size, config.hidden_size)  # see LlamaForCausalLM
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=weight)
        self.rotary = GemmaRotary(config)
        self.layers = nn.ModuleList(
            GemmaDecoderLayer(config, i, linear) for i in range(config.num_layers)
        )
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.ops = TORCH_OPS
        self.decoder = None

    @torch.inference_mode()
    def forward(
        self,
        batch: ForwardBatch,
        kv: KVPool,
        num_layers: int | None = None,
        hidden_states: bool = False,
    ) -> torch.Tensor:
        """As LlamaForCausalLM.forward."""
        x = self.embed_tokens(batch.input_ids)  # (T, hidden)
        # transformers rounds the scale to the weights' dtype first.
        x = x * torch.tensor(self.config.hidden_size**0.5, dtype=x.dtype)
        for layer in self.layers if num_layers is None else self.layers[:num_layers]:
            x = layer(x, batch, kv, self.rotary, self.ops)
        x = self.norm(x[batch.logits_indices])
        if hidden_states:
            return x
        logits = self.lm_head(x)
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """transformers' names; a multimodal Gemma 3's language model under its own prefix
        (model.language_model. in transformers v5, language_model.model. before)."""
        renamed = {}
        for name, w in weights.items():
            for old, new in _MULTIMODAL_PREFIXES:
                if name.startswith(old):
                    name = new + name.removeprefix(old)
                    break
            renamed[name] = w
        super().load_hf_weights(renamed)


_MULTIMODAL_PREFIXES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)
