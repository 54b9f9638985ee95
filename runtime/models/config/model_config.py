"""ModelConfig: the few numbers our forward needs, read from a model's config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from braid.runtime.models.config import families as config_families
from braid.runtime.models.config import moe as moe_config
from braid.runtime.models.layers import rope

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# HF `architectures` names we implement: variations of one Llama-shaped decoder (llama.py;
# Phi-3's partial rotary and longrope, SmolLM3's NoPE layers among them), and Gemma 2/3
# (gemma.py; a multimodal Gemma 3's language model alone).
SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration",
    "Phi3ForCausalLM",
    "SmolLM3ForCausalLM",
    *moe_config.MOE_ARCHITECTURES,
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


def causal_lm_architectures(model_type: object) -> list[str]:
    """The class transformers' AutoModelForCausalLM builds for `model_type`, for a config.json
    without `architectures` (one saved from a config object, as after a GGUF conversion)."""
    if not isinstance(model_type, str):
        return []
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    return [name] if isinstance(name, str) else []


def missing_keys(config: dict) -> list[str]:
    """The REQUIRED_KEYS a config.json lacks (and Qwen3's, Gemma's and GPT-OSS's head size,
    whose defaults are not hidden / heads)."""
    if not isinstance(config, dict):
        raise TypeError(f"config.json holds a {type(config).__name__}, not an object")
    own_head = ("Qwen3ForCausalLM", "GptOssForCausalLM", *config_families.GEMMA_ARCHITECTURES)
    keys = REQUIRED_KEYS + (
        ("head_dim",) if set(own_head) & set(config.get("architectures") or ()) else ()
    )
    return [k for k in keys if k not in config]


_QKV_ONLY_BIAS = (
    "Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "Phi3ForCausalLM",
)


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
    attention_bias: bool  # biases on q/k/v (Qwen2), and on o where the family has one
    qk_norm: bool  # Qwen3: RMSNorm on each head of q and k
    eos_token_ids: tuple[int, ...]
    rope_parameters: dict
    # Each layer's sliding window (a token sees the `window` latest positions, itself
    # included), None where a layer sees everything; () when none slides (config_families.py).
    layer_windows: tuple[int | None, ...] = ()
    # Gemma 2/3 (gemma.py): the sliding layers' own rope (Gemma 3's local base), scores
    # scaled by query_pre_attn_scalar ** -0.5, tanh soft-caps on scores and final logits.
    local_rope_parameters: dict | None = None
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    # SmolLM3: the layers that do not rotate q and k (NoPE).
    nope_layers: tuple[int, ...] = ()
    # Mixture of experts (moe.py): the experts, the router's top k, which layers are sparse.
    moe: moe_config.MoeConfig | None = None
    # The longest sequence the engine runs (EngineConfig.context_length), None: the model's
    # max_position_embeddings. Only longrope's choice of factors reads it (rope._longrope).
    context_length: int | None = None

    @classmethod
    def from_dict(cls, config: dict) -> ModelConfig:
        """From a config.json holding every REQUIRED_KEYS (or a transformers config's to_dict())."""
        archs = config.get("architectures") or causal_lm_architectures(config.get("model_type"))
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"unsupported model architecture {archs!r} (model_type "
                f"{config.get('model_type')!r}); "
                f"braid supports {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        config = config_families.text_config(config)
        extra = config_families.extra_fields(config, arch)
        if arch in moe_config.MOE_ARCHITECTURES:
            extra |= moe_config.extra_fields(config, arch)
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
            eos_token_ids=eos_ids,
            **{
                "qk_norm": arch == "Qwen3ForCausalLM",
                "attention_bias": arch == "Qwen2ForCausalLM" or bool(config.get("attention_bias")),
                "rope_parameters": extra.get("rope_parameters") or rope.rope_parameters(config),
            }
            | extra,
        )

    @property
    def o_proj_bias(self) -> bool:
        """Whether attention_bias puts a bias on o_proj too: it does in transformers' Llama,
        Qwen3, Gemma, SmolLM3 and Qwen3-MoE; Qwen2's family, Mistral's and Phi-3 bias q/k/v
        only."""
        return self.attention_bias and self.architecture not in _QKV_ONLY_BIAS

    @classmethod
    def from_hf(cls, hf: PretrainedConfig) -> ModelConfig:
        return cls.from_dict(hf.to_dict())

    def rope_inv_freq(self, local: bool = False) -> tuple[torch.Tensor, float]:
        """Inverse frequencies [head_dim / 2] and the cos/sin scale (yarn scales attention);
        `local`: the sliding layers' (local_rope_parameters)."""
        params = self.local_rope_parameters if local else self.rope_parameters
        return rope.inv_freq(
            params, self.head_dim, self.max_position_embeddings, self.context_length
        )
