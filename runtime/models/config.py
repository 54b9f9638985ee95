"""ModelConfig: the few numbers our forward needs, read from a model's config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from braid.runtime.models import rope

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# HF `architectures` names we implement, all variations of one Llama-shaped decoder.
SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)
# Keys read straight from config.json. transformers' defaults for the others differ by
# architecture (key/value heads, head size, eos), so a config.json without one of these is
# read through transformers' own config class instead (model_loader.load_model_config).
REQUIRED_KEYS = (
    "architectures",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "rms_norm_eps",
    "max_position_embeddings",
    "tie_word_embeddings",
    "eos_token_id",
)


def missing_keys(config: dict) -> list[str]:
    """The REQUIRED_KEYS a config.json lacks (and Qwen3's head size, 128 when left out)."""
    if not isinstance(config, dict):
        raise TypeError(f"config.json holds a {type(config).__name__}, not an object")
    keys = REQUIRED_KEYS + (
        ("head_dim",) if "Qwen3ForCausalLM" in config.get("architectures", ()) else ()
    )
    return [k for k in keys if k not in config]


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
    rope_parameters: dict

    @classmethod
    def from_dict(cls, config: dict) -> ModelConfig:
        """From a config.json holding every REQUIRED_KEYS (or a transformers config's to_dict())."""
        archs = config.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"unsupported model architecture {archs or config.get('model_type')!r}; "
                f"braid supports {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        eos = config["eos_token_id"]
        eos_ids = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
        heads = config["num_attention_heads"]
        return cls(
            architecture=arch,
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=config["num_key_value_heads"] or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            rms_norm_eps=config["rms_norm_eps"],
            max_position_embeddings=config["max_position_embeddings"],
            tie_word_embeddings=bool(config["tie_word_embeddings"]),
            attention_bias=arch == "Qwen2ForCausalLM" or bool(config.get("attention_bias")),
            qk_norm=arch == "Qwen3ForCausalLM",
            eos_token_ids=eos_ids,
            rope_parameters=rope.rope_parameters(config),
        )

    @classmethod
    def from_hf(cls, hf: PretrainedConfig) -> ModelConfig:
        return cls.from_dict(hf.to_dict())

    def rope_inv_freq(self) -> tuple[torch.Tensor, float]:
        """Inverse frequencies [head_dim / 2] and the cos/sin scale (yarn scales attention)."""
        return rope.inv_freq(self.rope_parameters, self.head_dim, self.max_position_embeddings)
