"""What a config.json says beyond the Llama shape: sliding windows (Mistral, Qwen2/3, Gemma,
Phi-3, GPT-OSS), Gemma's own settings (query scaling, soft-caps, the local layers' rope),
Phi-3's rope (longrope, partial rotary) and SmolLM3's layers without rope.

ModelConfig.from_dict takes these fields from `extra_fields`; the names and conventions are
transformers' (configuration_gemma2.py, configuration_gemma3.py, masking_utils.py).
"""

from __future__ import annotations

from braid.runtime.models.layers import rope

GEMMA_ARCHITECTURES = ("Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
# Families whose config class defaults sliding_window to None (no window).
_NO_DEFAULT_WINDOW = ("LlamaForCausalLM", "Phi3ForCausalLM", "SmolLM3ForCausalLM")
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
    if arch in ("Gemma2ForCausalLM", "GptOssForCausalLM"):
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if arch.startswith("Gemma3"):
        pattern = config.get("sliding_window_pattern") or 6
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if arch == "SmolLM3ForCausalLM":  # NoPE layers slide when use_sliding_window is set
        slide = config.get("use_sliding_window") and config.get("sliding_window") is not None
        nope = set(nope_layers(config))
        return ["sliding_attention" if slide and i in nope else "full_attention" for i in range(n)]
    if arch.startswith("Qwen"):
        first = config.get("max_window_layers", n)
        return ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    return ["sliding_attention"] * n  # Mistral: every layer


def layer_windows(config: dict, arch: str) -> tuple[int | None, ...]:
    """Each layer's sliding window (a token sees the `window` latest positions, itself
    included: transformers' `kv_idx > q_idx - sliding_window`), None for a full layer; ()
    when no layer slides."""
    # A config.json without the key gets transformers' default, 4096 for these families
    # (None for Phi-3 and SmolLM3, 128 for GPT-OSS).
    default = None if arch in _NO_DEFAULT_WINDOW else 128 if arch == "GptOssForCausalLM" else 4096
    window = config.get("sliding_window", default)
    if arch.startswith("Qwen") and not config.get("use_sliding_window"):
        window = None  # transformers ignores Qwen's sliding_window unless this is set
    if arch == "LlamaForCausalLM" or not window:
        return ()
    types = layer_types(config, arch)
    if len(types) != config["num_hidden_layers"]:
        raise ValueError(f"layer_types has {len(types)} entries, not num_hidden_layers")
    windows = tuple(int(window) if t == "sliding_attention" else None for t in types)
    return windows if any(windows) else ()


def nope_layers(config: dict) -> tuple[int, ...]:
    """SmolLM3's layers without rope: `no_rope_layers` holds 1 for a layer that rotates, 0 for
    one that does not; without it, every `no_rope_layer_interval`-th layer (the 4th, 8th, ...)
    is NoPE (transformers' SmolLM3Config)."""
    n = config["num_hidden_layers"]
    flags = config.get("no_rope_layers")
    if flags is None:
        interval = config.get("no_rope_layer_interval") or 4
        flags = [int((i + 1) % interval != 0) for i in range(n)]
    if len(flags) != n:
        raise ValueError(f"no_rope_layers has {len(flags)} entries, not num_hidden_layers")
    return tuple(i for i, rotates in enumerate(flags) if not rotates)


def _phi3_rope(config: dict) -> dict:
    """Phi-3's rope: its old rope_scaling types "su" and "yarn" are longrope (transformers'
    Phi3Config), the original context beside them at the top level."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    kind = params.pop("type", None) or params.get("rope_type")
    if kind in ("su", "yarn"):
        kind = "longrope"
    if kind is not None:
        params["rope_type"] = kind
    return rope.rope_parameters({**config, "rope_parameters": params, "rope_scaling": None})


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
    if arch == "Phi3ForCausalLM":
        fields["rope_parameters"] = _phi3_rope(config)
    if arch == "SmolLM3ForCausalLM":
        fields["nope_layers"] = nope_layers(config)
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
