"""The Llama family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2/2.5, Qwen3), our own forward.

Differences between the members are three switches in ModelConfig: q/k/v biases (Qwen2),
per-head q/k RMSNorm (Qwen3), and the rope flavour (default, linear, llama3, yarn).
q/k/v and gate/up are fused into one matmul each.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.attention import paged_attention
from runtime.forward_batch import ForwardBatch
from runtime.kv_cache import KVPool
from runtime.models.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 as the reference does, then cast back before the weight.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin: (T, 1, D/2) each


class Rotary(nn.Module):
    """cos/sin tables for every position, applied in the half-split (non-interleaved) layout."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        half = config.head_dim // 2
        self.register_buffer(
            "cos", torch.empty(config.max_position_embeddings, half), persistent=False
        )
        self.register_buffer(
            "sin", torch.empty(config.max_position_embeddings, half), persistent=False
        )
        self.reset()

    def reset(self) -> Rotary:
        """Compute the tables (again after the model was built on the meta device)."""
        with torch.device("cpu"):  # also when the model is being built on the meta device
            inv_freq, scale = self.config.rope_inv_freq()
            t = torch.arange(self.config.max_position_embeddings, dtype=torch.float32)
            freqs = torch.outer(t, inv_freq).to(self.cos.device)  # (max_pos, D/2)
        self.cos.copy_(freqs.cos() * scale)
        self.sin.copy_(freqs.sin() * scale)
        return self

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
        """cos/sin for these positions, each (T, 1, D/2), in the model's dtype as transformers
        applies them (once per forward, shared by all layers)."""
        cos = self.cos[positions].unsqueeze(1).to(dtype)
        return cos, self.sin[positions].unsqueeze(1).to(dtype)


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate x (T, heads, D) in the half-split layout."""
    cos, sin = rope
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias
        )
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.qk_norm = config.qk_norm
        self.scale = self.head_dim**-0.5

    def forward(self, x: torch.Tensor, batch: ForwardBatch, kv: KVPool, rope: Rope) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        qk = qk.view(-1, self.num_heads + self.num_kv_heads, self.head_dim)  # (T, H+Hkv, D)
        v = v.view(-1, self.num_kv_heads, self.head_dim)  # (T, Hkv, D)
        if self.qk_norm:
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
            qk = torch.cat([self.q_norm(q), self.k_norm(k)], dim=1)
        # q and k rotated in one go: same positions, same tables.
        q, k = apply_rope(qk, rope).split([self.num_heads, self.num_kv_heads], dim=1)
        out = paged_attention(q, k, v, kv, self.layer, batch, self.scale)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, kv: KVPool, rope: Rope) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), batch, kv, rope)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.rotary = Rotary(config)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @torch.inference_mode()
    def forward(
        self, batch: ForwardBatch, kv: KVPool, num_layers: int | None = None
    ) -> torch.Tensor:
        """Next-token logits [N, V] (fp32) for the rows in batch.logits_indices. With
        `num_layers`, only the first layers run before the head (a self-draft)."""
        x = self.embed_tokens(batch.input_ids)  # (T, hidden)
        rope = self.rotary(batch.positions, x.dtype)
        for layer in self.layers[:num_layers]:
            x = layer(x, batch, kv, rope)
        x = self.norm(x[batch.logits_indices])
        return self.lm_head(x).float()

    def load_hf_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy weights named as in transformers' checkpoints, fusing q/k/v and gate/up."""
        own = self.state_dict()
        expected = set(own)
        if self.config.tie_word_embeddings:
            expected.discard("lm_head.weight")

        def put(name: str, tensor: torch.Tensor) -> None:
            if own[name].shape != tensor.shape:
                raise ValueError(
                    f"weight {name}: checkpoint has shape {tuple(tensor.shape)}, "
                    f"the config implies {tuple(own[name].shape)}"
                )
            own[name].copy_(tensor)

        def take(name: str) -> torch.Tensor:
            if name not in weights:
                raise ValueError(f"checkpoint is missing weight {name!r}")
            return weights[name]

        for name in sorted(expected):
            hf = "model." + name if not name.startswith("lm_head") else name
            if ".qkv_proj." in name:
                parts = [hf.replace("qkv_proj", p) for p in ("q_proj", "k_proj", "v_proj")]
                put(name, torch.cat([take(p) for p in parts]))
            elif ".gate_up_proj." in name:
                parts = [hf.replace("gate_up_proj", p) for p in ("gate_proj", "up_proj")]
                put(name, torch.cat([take(p) for p in parts]))
            else:
                put(name, take(hf))
