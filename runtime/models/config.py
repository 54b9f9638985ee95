"""ModelConfig: the few numbers our forward needs, read from a transformers config."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

# HF `architectures` names we implement, all variations of one Llama-shaped decoder.
SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)
# Rope types whose frequencies do not depend on the sequence length, so one table serves all.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # Qwen2: biases on q/k/v
    qk_norm: bool  # Qwen3: RMSNorm on each head of q and k
    eos_token_ids: tuple[int, ...]
    hf_config: PretrainedConfig

    @classmethod
    def from_hf(cls, hf: PretrainedConfig) -> ModelConfig:
        archs = getattr(hf, "architectures", None) or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"unsupported model architecture {archs or hf.model_type!r}; "
                f"braid supports {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        rope_type = _rope_parameters(hf).get("rope_type", "default")
        if rope_type not in STATIC_ROPE_TYPES:
            raise ValueError(
                f"unsupported rope_type {rope_type!r}; "
                f"braid supports {', '.join(STATIC_ROPE_TYPES)}"
            )
        eos = hf.eos_token_id
        eos_ids = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        return cls(
            architecture=arch,
            vocab_size=hf.vocab_size,
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_layers=hf.num_hidden_layers,
            num_heads=hf.num_attention_heads,
            num_kv_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
            head_dim=head_dim,
            rms_norm_eps=hf.rms_norm_eps,
            max_position_embeddings=hf.max_position_embeddings,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            attention_bias=arch == "Qwen2ForCausalLM" or bool(getattr(hf, "attention_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            eos_token_ids=eos_ids,
            hf_config=hf,
        )

    def rope_inv_freq(self) -> tuple[torch.Tensor, float]:
        """Inverse frequencies [head_dim / 2] and the cos/sin scale (yarn scales attention)."""
        params = _rope_parameters(self.hf_config)
        rope_type = params.get("rope_type", "default")
        if rope_type == "default":
            theta = params.get("rope_theta", 10000.0)
            exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim
            return (1.0 / theta**exponents).float(), 1.0
        inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](self.hf_config, "cpu")
        return inv_freq.float(), float(scale)


def _rope_parameters(hf: PretrainedConfig) -> dict:
    return dict(getattr(hf, "rope_parameters", None) or {})
