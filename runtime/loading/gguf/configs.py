"""A GGUF file's config.json, per llama.cpp architecture, as llama.cpp reads the file.

transformers' GGUF reader gives the config of the architectures it knows; what it leaves out
(settings llama.cpp takes from its own defaults for the family, or from tensors) is completed
here. For the architectures it does not know (Mixtral, which llama.cpp stores as "llama" with
experts; "olmoe"; "smollm3"; "gpt-oss", whose YaRN keys its reader misreads), the config is
built here from the metadata keys llama.cpp's convert_hf_to_gguf.py writes (gguf-py's
constants name them: `{arch}.block_count`, ...).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from braid.runtime.loading.gguf.tensors import read_tensors

# llama.cpp's architecture -> the HF architecture its files are read as. "llama" files with
# experts are Mixtral's (is_mixtral).
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen2moe": "Qwen2MoeForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "gpt-oss": "GptOssForCausalLM",
}
# An old Mixtral file's per-expert tensor (blk.N.ffn_gate.E.weight; newer files stack them).
OLD_EXPERT = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight")
# llama.cpp's smollm3 has no key for its layers without rope: every fourth layer is one.
_SMOLLM3_NOPE_INTERVAL = 4
# llama.cpp's gpt-oss reads no key for its experts' SwiGLU: these are fixed in its graph.
_GPT_OSS_SWIGLU = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}
# YaRN keys llama.cpp's converter writes for GPT-OSS, with llama.cpp's defaults; others
# (an extrapolation or attention factor, a log multiplier) are refused.
_YARN_KEYS = {"yarn_beta_fast": ("beta_fast", 32.0), "yarn_beta_slow": ("beta_slow", 1.0)}


def metadata(gguf_path: Path) -> dict:
    """The file's key/value metadata (the tokenizer's arrays as their lengths), read with
    transformers' GGUF reader, which skips over what it is not asked for."""
    from transformers.integrations.gguf import read_gguf_metadata

    return read_gguf_metadata(str(gguf_path))[0]


def is_mixtral(arch: str, tensor_names: list[str]) -> bool:
    return arch == "llama" and any(
        n.endswith("_exps.weight") or OLD_EXPERT.fullmatch(n) for n in tensor_names
    )


def built_here(arch: str, tensor_names: list[str]) -> bool:
    """Whether the config is built here (transformers' GGUF reader does not know the file)."""
    return arch in ("olmoe", "smollm3", "gpt-oss") or is_mixtral(arch, tensor_names)


def write_config(
    gguf_path: Path, meta: dict, tensor_names: list[str], embedding_rows: int, out_dir: Path
) -> str:
    """Write out_dir/config.json for the file (transformers' tokenizer files are already
    there); returns the HF architecture."""
    arch = meta["general.architecture"]
    if built_here(arch, tensor_names):
        hf_arch = _build(gguf_path, meta, arch, tensor_names, embedding_rows, out_dir)
    else:
        from transformers import AutoConfig

        hf_arch = ARCHITECTURES[arch]
        folder, name = str(gguf_path.parent), gguf_path.name
        try:
            config = AutoConfig.from_pretrained(folder, gguf_file=name)
        except Exception as e:
            raise ValueError(f"{gguf_path}: transformers cannot read its config: {e}") from e
        config.architectures = [hf_arch]
        config.save_pretrained(out_dir)
    file = out_dir / "config.json"
    config = json.loads(file.read_text())
    if arch in ("gemma2", "gemma3"):
        _complete_gemma(meta, arch, config, out_dir)
    elif arch == "phi3":
        _complete_phi3(gguf_path, meta, config)
    elif arch in ("qwen2moe", "qwen3moe"):
        _complete_qwen_moe(meta, arch, config)
    elif arch == "gpt-oss":  # harmony's ends: of the answer, and before a tool call
        _add_eos_tokens(config, out_dir, ("<|return|>", "<|call|>"))
    file.write_text(json.dumps(config, indent=2))
    return hf_arch


def _build(
    gguf_path: Path,
    meta: dict,
    arch: str,
    tensor_names: list[str],
    embedding_rows: int,
    out_dir: Path,
) -> str:
    """The config of a Mixtral, OLMoE, SmolLM3 or GPT-OSS file, as transformers' config class
    holds it, from the keys llama.cpp's converter writes."""
    import transformers

    def key(name: str, default=None):
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"{gguf_path}: GGUF key {arch}.{name} is missing")
        if isinstance(value, list):
            raise ValueError(f"{gguf_path}: per-layer {arch}.{name} is unsupported")
        return value

    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    head_dim = int(key("attention.key_length", hidden // heads))
    rope = _rope(gguf_path, meta, arch, key)
    if "rope_freqs.weight" in tensor_names:
        raise ValueError(f"{gguf_path}: rope frequency factors (rope_freqs) are unsupported")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    fields = dict(
        vocab_size=embedding_rows,
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_hidden_layers=int(key("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(key("attention.head_count_kv", heads)),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(key("context_length")),
        rope_parameters=rope,
        tie_word_embeddings="output.weight" not in tensor_names,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=eos,
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id", eos),
    )
    if arch in ("olmoe", "smollm3") and head_dim != hidden // heads:
        raise ValueError(f"{gguf_path}: {arch} with a head size of {head_dim} is unsupported")
    if arch == "llama":  # Mixtral: the experts' size is the feed-forward length
        config = transformers.MixtralConfig(
            **fields,
            head_dim=head_dim,
            num_local_experts=int(key("expert_count")),
            num_experts_per_tok=int(key("expert_used_count")),
            sliding_window=None,  # llama.cpp's llama has none
        )
    elif arch == "olmoe":
        experts_size = key("expert_feed_forward_length", fields["intermediate_size"])
        fields["intermediate_size"] = int(experts_size)
        config = transformers.OlmoeConfig(
            **fields,
            num_experts=int(key("expert_count")),
            num_experts_per_tok=int(key("expert_used_count")),
            norm_topk_prob=False,  # llama.cpp's olmoe weighs the top k as they are
            clip_qkv=None,  # nor does it clamp q/k/v (OLMoE-1B-7B's clip_qkv is null)
        )
    elif arch == "smollm3":
        config = transformers.SmolLM3Config(
            **fields, no_rope_layer_interval=_SMOLLM3_NOPE_INTERVAL, use_sliding_window=False
        )
    else:  # GPT-OSS, as llama.cpp runs it: the even layers slide, the odd ones are full
        fields["intermediate_size"] = int(key("expert_feed_forward_length"))
        config = transformers.GptOssConfig(
            **fields,
            head_dim=head_dim,
            num_local_experts=int(key("expert_count")),
            num_experts_per_tok=int(key("expert_used_count")),
            sliding_window=int(key("attention.sliding_window")),
            layer_types=[
                "full_attention" if i % 2 else "sliding_attention"
                for i in range(fields["num_hidden_layers"])
            ],
            attention_bias=True,
            **_GPT_OSS_SWIGLU,
        )
    hf_arch = "MixtralForCausalLM" if arch == "llama" else ARCHITECTURES[arch]
    config.architectures = [hf_arch]
    config.save_pretrained(out_dir)
    return hf_arch


def _rope(gguf_path: Path, meta: dict, arch: str, key) -> dict:
    """The rope of a file built here: its base, and GPT-OSS's YaRN (the ramp's ends floored
    and ceiled, as llama.cpp computes them: transformers' `truncate`)."""
    rope = {"rope_type": "default", "rope_theta": float(key("rope.freq_base", 1e4))}
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "none":
        return rope
    if scaling != "yarn" or arch != "gpt-oss":
        raise ValueError(f"{gguf_path}: {arch} with rope scaling {scaling!r} is unsupported")
    prefix = f"{arch}.rope.scaling."
    known = {"type", "factor", "original_context_length", *_YARN_KEYS}
    others = sorted(k for k in meta if k.startswith(prefix) and k[len(prefix) :] not in known)
    if others:
        raise ValueError(f"{gguf_path}: YaRN with {', '.join(others)} is unsupported")
    rope |= {
        "rope_type": "yarn",
        "factor": float(key("rope.scaling.factor")),
        "original_max_position_embeddings": int(key("rope.scaling.original_context_length")),
        "truncate": True,
    }
    for name, (ours, default) in _YARN_KEYS.items():
        rope[ours] = float(meta.get(prefix + name, default))
    return rope


def _complete_gemma(meta: dict, arch: str, config: dict, out_dir: Path) -> None:
    """What transformers' GGUF reader leaves out of a Gemma config.json, as llama.cpp reads
    the file (src/llama-model.cpp): query scaling by the head size (by hidden / heads for
    Gemma 3 27B, 62 layers), the soft-caps, Gemma 3's sliding-window pattern (every sixth
    layer global, unless the file says), the local rope base 10,000 and the global layers'
    rope scaling; <end_of_turn> ends generation as it does there."""
    layers, hidden = config["num_hidden_layers"], config["hidden_size"]
    head_dim = meta.get(f"{arch}.attention.key_length") or config["head_dim"]
    config["head_dim"] = head_dim
    big = arch == "gemma3" and layers == 62
    config["query_pre_attn_scalar"] = hidden // config["num_attention_heads"] if big else head_dim
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if f"{arch}.{key}" in meta:
            config[key] = float(meta[f"{arch}.{key}"])
        elif arch == "gemma3":
            config[key] = None
    if f"{arch}.attention.sliding_window" in meta:
        config["sliding_window"] = int(meta[f"{arch}.attention.sliding_window"])
    if arch == "gemma3":
        pattern = int(meta.get(f"{arch}.attention.sliding_window_pattern", 6))
        config["layer_types"] = [
            "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)
        ]
        theta = float(meta.get(f"{arch}.rope.freq_base", 1e6))
        full = {"rope_type": "default", "rope_theta": theta}
        if meta.get(f"{arch}.rope.scaling.type") == "linear":
            full |= {"rope_type": "linear", "factor": float(meta[f"{arch}.rope.scaling.factor"])}
        config["rope_parameters"] = {
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        }
    _add_eos_tokens(config, out_dir, ("<end_of_turn>",))


def _add_eos_tokens(config: dict, out_dir: Path, texts: tuple[str, ...]) -> None:
    """The tokens of `texts` the vocabulary has join the eos ids, as llama.cpp counts them
    among the tokens that end generation."""
    tokens = json.loads((out_dir / "tokenizer.json").read_text())["model"]["vocab"]
    eos = config.get("eos_token_id")
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    ends = [tokens.get(text) for text in texts] if isinstance(tokens, dict) else []
    ends = [t for t in ends if t is not None and t not in eos]
    if ends:
        config["eos_token_id"] = [*eos, *ends]


def _complete_phi3(gguf_path: Path, meta: dict, config: dict) -> None:
    """What transformers' GGUF reader leaves out of a Phi-3 config.json, as llama.cpp's
    converter writes it: the rotated share of a head, the original context, longrope's
    factors (the rope_factors_long/short tensors) and attention factor, the sliding window
    (which transformers applies; llama.cpp turns Phi's off)."""
    import gguf

    head_dim = config["hidden_size"] // config["num_attention_heads"]
    rotated = int(meta.get("phi3.rope.dimension_count", head_dim))
    rope = {
        "rope_type": "default",
        "rope_theta": float(meta.get("phi3.rope.freq_base", 10_000.0)),
        "partial_rotary_factor": rotated / head_dim,
    }
    factors = {
        t.name: gguf.quants.dequantize(t.data, t.type).ravel().tolist()
        for t in read_tensors(gguf_path)
        if t.name.startswith("rope_factors_")
    }
    if factors:
        rope |= {
            "rope_type": "longrope",
            "long_factor": factors["rope_factors_long.weight"],
            "short_factor": factors["rope_factors_short.weight"],
        }
        if "phi3.rope.scaling.attn_factor" in meta:
            rope["attention_factor"] = float(meta["phi3.rope.scaling.attn_factor"])
    original = meta.get("phi3.rope.scaling.original_context_length")
    if original:
        config["original_max_position_embeddings"] = int(original)
        rope["original_max_position_embeddings"] = int(original)
    config["rope_parameters"] = rope
    config["sliding_window"] = int(meta.get("phi3.attention.sliding_window", 0)) or None


def _complete_qwen_moe(meta: dict, arch: str, config: dict) -> None:
    """What transformers' GGUF reader leaves out of a Qwen2/3-MoE config.json, as llama.cpp
    reads the file: the experts' and the shared expert's sizes, every layer sparse, Qwen3-MoE's
    top-k renormalised (Qwen2-MoE's not), Qwen2's q/k/v biases."""
    config["moe_intermediate_size"] = int(meta[f"{arch}.expert_feed_forward_length"])
    if f"{arch}.expert_shared_feed_forward_length" in meta:
        config["shared_expert_intermediate_size"] = int(
            meta[f"{arch}.expert_shared_feed_forward_length"]
        )
    config |= {"decoder_sparse_step": 1, "mlp_only_layers": []}
    config["norm_topk_prob"] = arch == "qwen3moe"
    if arch == "qwen2moe":
        config["qkv_bias"] = True
