"""What a config.json says beyond the Llama shape: sliding windows (Mistral, Qwen2/3, Gemma)
and Gemma's own settings (query scaling, soft-caps, the local layers' rope).

ModelConfig.from_dict takes these fields from `extra_fields`; the names and conventions are
transformers' (configuration_gemma2.py, configuration_gemma3.py, masking_utils.py).
"""

from __future__ import annotations

from braid.runtime.models import rope

GEMMA_ARCHITECTURES = ("Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
# Gemma 3's default rope bases (transformers' Gemma3TextConfig.default_theta).
_GEMMA3_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}


def text_config(config: dict) -> dict:
    """A multimodal Gemma 3's language model config (its `text_config`, with the top-level
    keys it lacks, and its own eos ids), else the config itself."""
    if "Gemma3ForConditionalGeneration" not in (config.get("architectures") or ()):
        return config
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise ValueError("Gemma3ForConditionalGeneration config.json has no text_config")
    merged = {k: v for k, v in config.items() if k != "text_config"} | text
    if config.get("eos_token_id") is not None:  # the model's (end of turn too)
        merged["eos_token_id"] = config["eos_token_id"]
    return merged


def layer_types(config: dict, arch: str) -> list[str]:
    """Each layer's kind, sliding_attention or full_attention, as transformers derives them."""
    n = config["num_hidden_layers"]
    if config.get("layer_types"):
        return list(config["layer_types"])
    if arch == "Gemma2ForCausalLM":
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if arch.startswith("Gemma3"):
        pattern = config.get("sliding_window_pattern") or 6
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if arch.startswith("Qwen"):
        first = config.get("max_window_layers", n)
        return ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    return ["sliding_attention"] * n  # Mistral: every layer


def layer_windows(config: dict, arch: str) -> tuple[int | None, ...]:
    """Each layer's sliding window (a token sees the `window` latest positions, itself
    included: transformers' `kv_idx > q_idx - sliding_window`), None for a full layer; ()
    when no layer slides."""
    # A config.json without the key gets transformers' default, 4096 for these families.
    window = config.get("sliding_window", 4096)
    if arch.startswith("Qwen") and not config.get("use_sliding_window"):
        window = None  # transformers ignores Qwen's sliding_window unless this is set
    if arch == "LlamaForCausalLM" or not window:
        return ()
    types = layer_types(config, arch)
    if len(types) != config["num_hidden_layers"]:
        raise ValueError(f"layer_types has {len(types)} entries, not num_hidden_layers")
    windows = tuple(int(window) if t == "sliding_attention" else None for t in types)
    return windows if any(windows) else ()


def _gemma3_rope(config: dict) -> tuple[dict, dict]:
    """(full layers' rope, sliding layers' rope) of a Gemma 3 config.json: transformers v5's
    per-layer-type `rope_parameters`, or v4's `rope_theta` (with `rope_scaling`) and
    `rope_local_base_freq`."""
    params = config.get("rope_parameters") or {}
    per_type = {}
    for kind in ("full_attention", "sliding_attention"):
        own = params.get(kind)
        if own is None:
            if kind == "full_attention":
                own = dict(config.get("rope_scaling") or {})
                own.setdefault("rope_theta", config.get("rope_theta", _GEMMA3_THETA[kind]))
            else:
                own = {"rope_theta": config.get("rope_local_base_freq", _GEMMA3_THETA[kind])}
        flat = {k: v for k, v in config.items() if k not in ("rope_parameters", "rope_scaling")}
        flat["rope_parameters"] = dict(own)
        flat.setdefault("rope_theta", _GEMMA3_THETA[kind])
        per_type[kind] = rope.rope_parameters(flat)
    return per_type["full_attention"], per_type["sliding_attention"]


def extra_fields(config: dict, arch: str) -> dict:
    """ModelConfig's fields beyond the Llama shape, from a config.json of architecture `arch`."""
    fields: dict = {"layer_windows": layer_windows(config, arch)}
    if arch not in GEMMA_ARCHITECTURES:
        return fields
    if config.get("use_bidirectional_attention"):
        raise ValueError(
            "Gemma with use_bidirectional_attention (an embedding model) is unsupported"
        )
    activation = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
    if activation not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"unsupported Gemma hidden_activation {activation!r}")
    fields |= {
        "query_pre_attn_scalar": float(config.get("query_pre_attn_scalar") or 256),
        "attn_logit_softcapping": config.get("attn_logit_softcapping"),
        "final_logit_softcapping": config.get("final_logit_softcapping"),
    }
    if arch.startswith("Gemma3"):
        full, local = _gemma3_rope(config)
        fields |= {"rope_parameters": full, "local_rope_parameters": local, "qk_norm": True}
    return fields
