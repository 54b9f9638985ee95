"""Write a tiny transformers model of another family (Gemma 3, Phi-3, Qwen MoE, Mixtral,
OLMoE, SmolLM3, GPT-OSS) as a GGUF laid out the way llama.cpp's convert_hf_to_gguf.py writes
that family: write_hf_gguf. The tokenizer is the default model's, as scripts/random_gguf.py
copies it. Tests load this file as a module (tests/conftest.py's `hf_gguf`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from random_gguf import tokenizer_fields

Q = gguf.GGMLQuantizationType


# Each family's layer tensors: llama.cpp's name -> transformers' (under model.layers.{i}.).
_ATTENTION = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
}
_DENSE_MLP = {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_GEMMA3_LAYER = (
    _ATTENTION
    | _QK_NORMS
    | _DENSE_MLP
    | {
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    }
)
_PHI3_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_up": "mlp.gate_up_proj",  # gate's rows, then up's
    "ffn_down": "mlp.down_proj",
}
_ROUTER = {"ffn_gate_inp": "mlp.gate"}
_QWEN_MOE_LAYER = (
    _ATTENTION
    | _QK_NORMS
    | _ROUTER
    | {
        "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
        "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
        "ffn_up_shexp": "mlp.shared_expert.up_proj",
        "ffn_down_shexp": "mlp.shared_expert.down_proj",
    }
)
# The experts' projections: llama.cpp's stacked tensor (its old per-expert one is
# blk.N.ffn_gate.E) -> transformers' per-expert name, Mixtral's.
_EXPERTS = {
    "ffn_gate": ("gate_proj", "w1"),
    "ffn_up": ("up_proj", "w3"),
    "ffn_down": ("down_proj", "w2"),
}


@dataclass(frozen=True)
class _Family:
    arch: str  # llama.cpp's
    layer: dict[str, str]
    metadata: Callable[[gguf.GGUFWriter, dict], None]  # the family's own keys
    experts: bool = False
    # Layer tensors laid out the family's own way: (weights, "model.layers.{i}.", i) ->
    # (llama.cpp's name, float weight) pairs (GPT-OSS's sinks and biased experts).
    own_tensors: Callable[[dict, str, int], Any] | None = None
    permuted: bool = False  # q/k rows in llama.cpp's rope order (its Llama-style families)
    norm_shift: float = 0.0  # Gemma's norms are stored as 1 + w
    tied: bool = False  # transformers' default tie_word_embeddings


def _theta(config: dict, default: float) -> float:
    rope = config.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)  # Gemma 3's global layers'
    return rope.get("rope_theta", config.get("rope_theta", default))


def _head_dim(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def _gemma3_keys(writer: gguf.GGUFWriter, config: dict) -> None:
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_rope_freq_base(_theta(config, 1e6))
    full = (config.get("rope_parameters") or {}).get("full_attention") or {}
    if full.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(full["factor"])
    writer.add_sliding_window(config["sliding_window"])


def _phi3_keys(writer: gguf.GGUFWriter, config: dict) -> None:
    rope = config["rope_parameters"]
    if rope.get("rope_type") != "longrope":
        raise ValueError(f"a longrope Phi-3 is written here, not {rope}")
    original = config["original_max_position_embeddings"]
    scale = config["max_position_embeddings"] / original
    writer.add_rope_scaling_orig_ctx_len(original)
    writer.add_rope_dimension_count(int(_head_dim(config) * rope.get("partial_rotary_factor", 1.0)))
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_sliding_window(config.get("sliding_window") or 0)
    attn = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
    writer.add_rope_scaling_attn_factors(attn)


def _experts_keys(writer: gguf.GGUFWriter, config: dict) -> None:
    writer.add_expert_count(config.get("num_local_experts") or config["num_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])


def _qwen_moe_keys(writer: gguf.GGUFWriter, config: dict) -> None:
    writer.add_key_length(_head_dim(config))
    writer.add_value_length(_head_dim(config))
    writer.add_rope_freq_base(_theta(config, 10000.0))
    _experts_keys(writer, config)
    writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if "shared_expert_intermediate_size" in config:
        writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])


def _llama_keys(writer: gguf.GGUFWriter, config: dict) -> None:
    """A Llama-style family's (Mixtral, SmolLM3): rotated dimensions, key/value lengths."""
    writer.add_rope_freq_base(_theta(config, 10000.0))
    writer.add_rope_dimension_count(_head_dim(config))
    writer.add_key_length(_head_dim(config))
    writer.add_value_length(_head_dim(config))


def _mixtral_keys(writer: gguf.GGUFWriter, config: dict) -> None:
    _llama_keys(writer, config)
    _experts_keys(writer, config)


def _olmoe_keys(writer: gguf.GGUFWriter, config: dict) -> None:
    writer.add_rope_freq_base(_theta(config, 10000.0))
    _experts_keys(writer, config)
    if config.get("clip_qkv") is not None:
        raise ValueError("llama.cpp's olmoe does not clamp q/k/v: clip_qkv must be null")


def _smollm3_keys(writer: gguf.GGUFWriter, config: dict) -> None:
    # llama.cpp has no key for the NoPE layers: every fourth is one, whatever the model says.
    flags = config.get("no_rope_layers")
    if flags is not None and flags != [int((i + 1) % 4 != 0) for i in range(len(flags))]:
        raise ValueError(f"llama.cpp's smollm3 has every fourth layer NoPE, not {flags}")
    _llama_keys(writer, config)


def _gpt_oss_keys(writer: gguf.GGUFWriter, config: dict) -> None:
    """GPT-OSS's keys. llama.cpp reads no key for the experts' SwiGLU (alpha 1.702, limit 7
    in its graph), the layer pattern (sliding, full, ...), nor YaRN's truncation (it floors
    and ceils the ramp's ends): the model must hold those."""
    fixed = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0, "attention_bias": True}
    for key, value in fixed.items():
        if config.get(key, value) != value:
            raise ValueError(f"llama.cpp's gpt-oss has {key} {value}, not {config[key]}")
    n = config["num_hidden_layers"]
    alternating = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    if config.get("layer_types", alternating) != alternating:
        raise ValueError("llama.cpp's gpt-oss alternates sliding and full layers, sliding first")
    writer.add_key_length(_head_dim(config))
    writer.add_value_length(_head_dim(config))
    writer.add_rope_freq_base(_theta(config, 150000.0))
    rope = config.get("rope_parameters") or {}
    if rope.get("rope_type", "default") not in ("default", "yarn"):
        raise ValueError(f"a GPT-OSS with rope {rope.get('rope_type')!r} is not written here")
    if rope.get("rope_type") == "yarn":
        if not rope.get("truncate", True):
            raise ValueError("llama.cpp's YaRN truncates the ramp's ends: truncate must be true")
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_beta_fast(rope.get("beta_fast", 32.0))
        writer.add_rope_scaling_yarn_beta_slow(rope.get("beta_slow", 1.0))
    _experts_keys(writer, config)
    writer.add_expert_feed_forward_length(config["intermediate_size"])
    writer.add_sliding_window(config["sliding_window"])


def _gpt_oss_tensors(weights: dict, hf: str, i: int):
    """A GPT-OSS layer's sinks and experts as llama.cpp's converter writes them: transformers'
    gate_up_proj [E, hidden, 2 I] (gate in the even columns, up in the odd) split into gate
    and up, each [E, I, hidden]; down_proj [E, I, hidden] as [E, hidden, I]; their biases
    beside them."""
    yield f"blk.{i}.attn_sinks.weight", weights[f"{hf}self_attn.sinks"]
    experts = f"{hf}mlp.experts."
    gate_up, bias = weights[experts + "gate_up_proj"], weights[experts + "gate_up_proj_bias"]
    for name, first in (("ffn_gate_exps", 0), ("ffn_up_exps", 1)):
        yield f"blk.{i}.{name}.weight", gate_up[:, :, first::2].transpose(0, 2, 1)
        yield f"blk.{i}.{name}.bias", bias[:, first::2]
    yield f"blk.{i}.ffn_down_exps.weight", weights[experts + "down_proj"].transpose(0, 2, 1)
    yield f"blk.{i}.ffn_down_exps.bias", weights[experts + "down_proj_bias"]


_GPT_OSS_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "post_attention_norm": "post_attention_layernorm",  # the norm before the experts
    "ffn_gate_inp": "mlp.router",
}

# transformers' architecture -> how llama.cpp's convert_hf_to_gguf.py writes it.
_FAMILIES = {
    "Gemma3ForCausalLM": _Family("gemma3", _GEMMA3_LAYER, _gemma3_keys, norm_shift=1.0, tied=True),
    "Phi3ForCausalLM": _Family("phi3", _PHI3_LAYER, _phi3_keys),
    "Qwen3MoeForCausalLM": _Family("qwen3moe", _QWEN_MOE_LAYER, _qwen_moe_keys, experts=True),
    "Qwen2MoeForCausalLM": _Family("qwen2moe", _QWEN_MOE_LAYER, _qwen_moe_keys, experts=True),
    "MixtralForCausalLM": _Family(
        "llama", _ATTENTION | _ROUTER, _mixtral_keys, experts=True, permuted=True
    ),
    "OlmoeForCausalLM": _Family("olmoe", _ATTENTION | _QK_NORMS | _ROUTER, _olmoe_keys, True),
    "SmolLM3ForCausalLM": _Family("smollm3", _ATTENTION | _DENSE_MLP, _smollm3_keys, permuted=True),
    "GptOssForCausalLM": _Family(
        "gpt-oss", _GPT_OSS_LAYER, _gpt_oss_keys, own_tensors=_gpt_oss_tensors
    ),
}
# Matrix types a file from transformers' floats can hold (gguf-py quantizes Q8_0 and MXFP4).
_HF_TYPES = {
    "F32": (Q.F32, gguf.LlamaFileType.ALL_F32),
    "F16": (Q.F16, gguf.LlamaFileType.MOSTLY_F16),
    "Q8_0": (Q.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "MXFP4": (Q.MXFP4, gguf.LlamaFileType.MOSTLY_MXFP4_MOE),
}
# Types for the experts alone (llama.cpp's MXFP4_MOE): the other matrices stay F32 here.
_EXPERTS_ONLY = {Q.MXFP4}
# Per llama.cpp architecture, tokens its files' vocabularies have, in the place of special
# tokens of the default model that the tests never use: those llama.cpp's loader of a "phi3"
# vocabulary looks up (Phi-3's SentencePiece ones), GPT-OSS's harmony ends (of an answer,
# before a tool call).
_FAMILY_TOKENS = {
    "phi3": {"<repo_name>": "<s>", "<reponame>": "</s>", "<file_sep>": "<unk>"},
    "gpt-oss": {"<issue_start>": "<|return|>", "<issue_comment>": "<|call|>"},
}


def write_hf_gguf(
    path: str | Path, model_dir: str | Path, type: str = "F32", per_expert: bool = False
) -> Path:
    """Write a transformers directory (float weights; the default model's tokenizer, cut to the
    model's vocab_size: random_gguf.tokenizer_fields) of one
    of _FAMILIES as a GGUF laid out the way llama.cpp's convert_hf_to_gguf.py writes it: its
    architecture, metadata keys and tensor names; Gemma's norms as 1 + w; a Llama-style
    family's q/k rows permuted for llama.cpp's rope; Phi-3's fused attn_qkv and ffn_up
    (gate, then up) and its rope factor tensors; experts stacked per projection
    ([n_expert, rows, row length]), or with `per_expert` one tensor each (blk.N.ffn_gate.E,
    as old Mixtral files have them); GPT-OSS's sinks, and its experts' gate and up apart,
    with their biases. Matrices in `type` (F32, F16, Q8_0, or MXFP4: the experts alone, the
    other matrices F32, as llama.cpp's MXFP4_MOE files hold them); norms, routers, biases and
    every 1-D tensor in F32, as llama-quantize keeps them. Where llama.cpp reads no key for a
    setting (Gemma 3's layer pattern and local rope base, SmolLM3's NoPE layers, GPT-OSS's
    SwiGLU limit and layer pattern), the model must hold llama.cpp's fixed value."""
    import json

    from safetensors.numpy import load_file

    path, model_dir = Path(path), Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    family = _FAMILIES[config["architectures"][0]]
    weights: dict[str, np.ndarray] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        weights |= load_file(file)
    try:  # the default model's tokenizer, or as many of its tokens as the model has
        tokenizer = tokenizer_fields(config["vocab_size"])
    except ValueError as e:
        raise ValueError(f"{model_dir}: vocab_size {config['vocab_size']}: {e}") from None
    qtype, file_type = _HF_TYPES[type]

    writer = gguf.GGUFWriter(path, family.arch)
    writer.add_type("model")
    writer.add_name(f"random-{family.arch}")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    family.metadata(writer, config)
    writer.add_file_type(file_type)
    for key, value, vtype, sub_type in tokenizer:
        if key == "tokenizer.ggml.tokens" and family.arch in _FAMILY_TOKENS:
            value = [_FAMILY_TOKENS[family.arch].get(t, t) for t in value]
        writer.add_key_value(key, value, vtype, sub_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    for name, w in _hf_tensors(family, config, weights, per_expert):
        w = w.astype(np.float32)
        floats = w.ndim == 1 or "gate_inp" in name or not name.endswith(".weight")  # biases
        if qtype == Q.F32 or floats or (qtype in _EXPERTS_ONLY and "_exps." not in name):
            writer.add_tensor(name, w)
        elif qtype == Q.F16:
            writer.add_tensor(name, w.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# The names the tests and docs/benchmarks.md call it by.
write_gemma3_gguf = write_phi3_gguf = write_moe_gguf = write_gpt_oss_gguf = write_hf_gguf


def _hf_tensors(family: _Family, config: dict, weights: dict, per_expert: bool):
    """(llama.cpp's name, float weight) of every tensor the family's file holds."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    yield "token_embd.weight", weights["model.embed_tokens.weight"]
    if family.arch == "phi3":
        rope = config["rope_parameters"]
        for kind in ("long", "short"):
            yield f"rope_factors_{kind}.weight", np.asarray(rope[f"{kind}_factor"], np.float32)
    for i in range(config["num_hidden_layers"]):
        hf = f"model.layers.{i}."
        for name, ours in family.layer.items():
            for kind in ("weight", "bias"):
                w = weights.get(f"{hf}{ours}.{kind}")
                if w is None:
                    w = weights.get(f"{hf}{ours.replace('mlp.', 'block_sparse_moe.')}.{kind}")
                if w is None:
                    continue
                if name.endswith("norm"):
                    w = w + family.norm_shift
                elif name == "ffn_gate_inp_shexp":
                    w = w[0]  # (1, hidden) -> [hidden]
                elif family.permuted and name in ("attn_q", "attn_k"):
                    w = permute_rope(w, heads if name == "attn_q" else kv_heads)
                yield f"blk.{i}.{name}.{kind}", w
        if family.own_tensors is not None:
            yield from family.own_tensors(weights, hf, i)
        if family.experts:
            n = config.get("num_local_experts") or config["num_experts"]
            for name, names in _EXPERTS.items():
                experts = [_expert(weights, hf, e, names) for e in range(n)]
                if per_expert:
                    yield from ((f"blk.{i}.{name}.{e}.weight", w) for e, w in enumerate(experts))
                else:
                    yield f"blk.{i}.{name}_exps.weight", np.stack(experts)
    yield "output_norm.weight", weights["model.norm.weight"] + family.norm_shift
    if not config.get("tie_word_embeddings", family.tied):
        yield "output.weight", weights["lm_head.weight"]


def _expert(weights: dict, hf: str, e: int, names: tuple[str, str]) -> np.ndarray:
    ours, mixtral = names
    w = weights.get(f"{hf}mlp.experts.{e}.{ours}.weight")
    return w if w is not None else weights[f"{hf}block_sparse_moe.experts.{e}.{mixtral}.weight"]


def permute_rope(w: np.ndarray, num_heads: int) -> np.ndarray:
    """q/k rows from transformers' half-split rope layout to llama.cpp's interleaved pairs
    (what its converter does to a Llama; runtime/loading/gguf/files.py's unpermute_rope undoes
    it)."""
    half = w.shape[0] // num_heads // 2
    # (heads, 2, half) -> (heads, half, 2)
    return w.reshape(num_heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
