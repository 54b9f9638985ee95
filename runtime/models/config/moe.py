"""What a mixture-of-experts config.json says (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE, GPT-OSS),
read into MoeConfig; the names and conventions are transformers' (configuration_qwen3_moe.py,
configuration_qwen2_moe.py, configuration_mixtral.py, configuration_olmoe.py,
configuration_gpt_oss.py)."""

from __future__ import annotations

from dataclasses import dataclass

from braid.runtime.models.layers import rope

MOE_ARCHITECTURES = (
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
    "MixtralForCausalLM",
    "OlmoeForCausalLM",
    "GptOssForCausalLM",
)
# GPT-OSS's rope when its config.json names none (transformers' GptOssConfig defaults).
_GPT_OSS_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    top_k: int  # experts per token
    intermediate_size: int  # each expert's
    # Renormalise the top-k softmax probabilities to sum to 1 (Mixtral always does).
    norm_topk_prob: bool
    # Qwen2-MoE: an always-on expert of this size, gated by sigmoid(x @ w); 0 when none.
    shared_intermediate_size: int
    # Per layer: whether its MLP is the experts (else a dense MLP of the model's
    # intermediate_size: Qwen's mlp_only_layers and decoder_sparse_step).
    sparse_layers: tuple[bool, ...]
    # OLMoE: q and k RMS-normalised over all heads at once, then clamped to +-clip_qkv.
    olmoe_qk_norm: bool = False
    clip_qkv: float | None = None
    # GPT-OSS (gpt_oss.py): each expert's clamped SwiGLU, (up + 1) * gate * sigmoid(alpha *
    # gate) with gate clamped above at `swiglu_limit` and up to +-swiglu_limit.
    swiglu_alpha: float | None = None
    swiglu_limit: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok {self.top_k} must be in 1..num_experts {self.num_experts}"
            )


def extra_fields(config: dict, arch: str) -> dict:
    """ModelConfig's fields for a mixture-of-experts config.json of architecture `arch`."""
    n = config["num_hidden_layers"]
    if arch == "GptOssForCausalLM":
        return _gpt_oss_fields(config)
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{arch} with hidden_act {config['hidden_act']!r} is unsupported")
    num_experts = _num_experts(config, arch)
    if arch == "MixtralForCausalLM":
        moe = MoeConfig(
            num_experts=num_experts,
            top_k=config["num_experts_per_tok"],
            intermediate_size=config["intermediate_size"],
            norm_topk_prob=True,
            shared_intermediate_size=0,
            sparse_layers=(True,) * n,
        )
        return {"moe": moe}
    fields: dict = {}
    if arch.startswith("Qwen"):
        step = config.get("decoder_sparse_step") or 1
        dense = set(config.get("mlp_only_layers") or ())
        sparse = tuple(i not in dense and (i + 1) % step == 0 for i in range(n))
        shared = (config.get("shared_expert_intermediate_size") or 0) if "Qwen2" in arch else 0
        fields["qk_norm"] = arch == "Qwen3MoeForCausalLM"
        if arch == "Qwen2MoeForCausalLM":  # transformers v4: always; v5: qkv_bias
            fields["attention_bias"] = bool(config.get("qkv_bias", True))
    else:  # OLMoE
        if config.get("attention_bias"):
            raise ValueError("OLMoE with attention_bias (an o_proj bias) is unsupported")
        sparse, shared = (True,) * n, 0
        fields["layer_windows"] = ()  # no sliding window (its config.json names none)
    fields["moe"] = MoeConfig(
        num_experts=num_experts,
        top_k=config["num_experts_per_tok"],
        intermediate_size=config["moe_intermediate_size"]
        if "moe_intermediate_size" in config
        else config["intermediate_size"],
        norm_topk_prob=bool(config.get("norm_topk_prob", False)),
        shared_intermediate_size=shared,
        sparse_layers=sparse,
        olmoe_qk_norm=arch == "OlmoeForCausalLM",
        clip_qkv=config.get("clip_qkv") if arch == "OlmoeForCausalLM" else None,
    )
    return fields


def _gpt_oss_fields(config: dict) -> dict:
    """GPT-OSS: every layer's MLP is the experts (softmax over the top k router logits, so
    the k weights sum to 1), biases on q/k/v/o (attention_bias, on by default), YaRN rope with
    transformers' defaults where the config.json names none. Its hidden_act is not read (the
    experts' activation is the clamped SwiGLU, whatever it says), as transformers does."""
    quantized = config.get("quantization_config") or {}
    if quantized and quantized.get("quant_method") != "mxfp4":
        raise ValueError(
            f"GptOssForCausalLM quantized as {quantized.get('quant_method')!r} is unsupported "
            "(braid reads float or mxfp4 checkpoints)"
        )
    num_experts = _num_experts(config, "GptOssForCausalLM")
    if not (config.get("rope_parameters") or config.get("rope_scaling")):
        config = {**config, "rope_parameters": _GPT_OSS_ROPE}
    moe = MoeConfig(
        num_experts=num_experts,
        top_k=config["num_experts_per_tok"],
        intermediate_size=config["intermediate_size"],
        norm_topk_prob=True,
        shared_intermediate_size=0,
        sparse_layers=(True,) * config["num_hidden_layers"],
        swiglu_alpha=float(config.get("swiglu_alpha", 1.702)),
        swiglu_limit=float(config.get("swiglu_limit", 7.0)),
    )
    return {
        "moe": moe,
        "attention_bias": bool(config.get("attention_bias", True)),
        "rope_parameters": rope.rope_parameters(
            {**config, "rope_theta": config.get("rope_theta", 150000.0)}
        ),
    }


def _num_experts(config: dict, arch: str) -> int:
    # transformers v5 writes num_local_experts for every family; the hubs' Qwen and OLMoE
    # configs say num_experts.
    num_experts = config.get("num_local_experts") or config.get("num_experts")
    if not num_experts:
        raise ValueError(f"{arch} config.json names no num_local_experts (or num_experts)")
    return num_experts
