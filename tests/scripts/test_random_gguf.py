"""scripts/random_gguf.py: each --type writes a tiny model that reads back with the expected
tensor types and shapes, finite weights of the intended spread, and the default tokenizer."""

from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
from conftest import random_gguf

pytestmark = pytest.mark.model  # the tool copies the default model's tokenizer

tool = random_gguf()

SMALL_VOCAB = 1024
TINY = tool.SHAPES["tiny"]
# llama.cpp's Q4_K_M / Q5_K_M rule on 2 layers: the output, and attn_v and ffn_down of layer 1.
MORE_BITS = {"output.weight", "blk.1.attn_v.weight", "blk.1.ffn_down.weight"}


def test_a_cut_vocabulary_keeps_the_merges_among_its_tokens():
    """A cut of the default tokenizer (GGUFReader parses every token of a file, about 2 s for
    all 49,152, too slow to read back one file per type): its first tokens, and exactly the
    default's merges whose parts and result are among them."""
    full = {key: value for key, value, *_ in tool.tokenizer_fields()}
    cut = {key: value for key, value, *_ in tool.tokenizer_fields(SMALL_VOCAB)}
    assert cut["tokenizer.ggml.tokens"] == full["tokenizer.ggml.tokens"][:SMALL_VOCAB]
    assert len(cut["tokenizer.ggml.token_type"]) == SMALL_VOCAB
    kept = set(cut["tokenizer.ggml.tokens"])
    merges = [m for m in full["tokenizer.ggml.merges"] if m.replace(" ", "", 1) in kept]
    assert cut["tokenizer.ggml.merges"] == merges and len(merges) > SMALL_VOCAB // 2
    assert {k: v for k, v in cut.items() if "ggml.t" not in k and "merges" not in k} == {
        k: v for k, v in full.items() if "ggml.t" not in k and "merges" not in k
    }
    with pytest.raises(ValueError, match="512 to 49152 tokens"):
        tool.tokenizer_fields(100)


def expected_shapes(vocab: int) -> dict[str, tuple[int, ...]]:
    h, f, d = TINY.hidden, TINY.intermediate, TINY.head_dim
    shapes = {
        "token_embd.weight": (vocab, h),
        "output_norm.weight": (h,),
        "output.weight": (vocab, h),
    }
    for i in range(TINY.layers):
        shapes |= {
            f"blk.{i}.attn_norm.weight": (h,),
            f"blk.{i}.attn_q.weight": (TINY.heads * d, h),
            f"blk.{i}.attn_k.weight": (TINY.kv_heads * d, h),
            f"blk.{i}.attn_v.weight": (TINY.kv_heads * d, h),
            f"blk.{i}.attn_output.weight": (h, TINY.heads * d),
            f"blk.{i}.ffn_norm.weight": (h,),
            f"blk.{i}.ffn_gate.weight": (f, h),
            f"blk.{i}.ffn_up.weight": (f, h),
            f"blk.{i}.ffn_down.weight": (h, f),
        }
    return shapes


def expected_type(name: str, type: str) -> gguf.GGMLQuantizationType:
    if name.endswith("norm.weight"):
        return gguf.GGMLQuantizationType.F32
    if type in ("Q4_K_M", "Q5_K_M") and name in MORE_BITS:
        return gguf.GGMLQuantizationType.Q6_K
    return tool.TYPES[type][0]


@pytest.mark.parametrize("type", tool.TYPES)
def test_each_type_reads_back(type, tmp_path):
    path = tool.write_random_gguf(tmp_path / "tiny.gguf", "tiny", type, seed=1, vocab=SMALL_VOCAB)

    reader = gguf.GGUFReader(path)
    shapes = expected_shapes(SMALL_VOCAB)
    assert sorted(t.name for t in reader.tensors) == sorted(shapes)
    for t in reader.tensors:
        assert t.tensor_type == expected_type(t.name, type), t.name
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        assert w.shape == shapes[t.name], t.name
        assert np.isfinite(w).all(), t.name
        if t.name.endswith("norm.weight"):
            assert abs(w.mean() - 1) < 0.05, t.name
        else:
            std = 1 / math.sqrt(TINY.hidden) if t.name == "token_embd.weight" else 0.02
            assert 0.8 * std < w.std() < 1.25 * std, (t.name, w.std())
    if type in ("Q4_K_M", "Q5_K_M"):
        types = {t.tensor_type for t in reader.tensors}
        assert {tool.TYPES[type][0], gguf.GGMLQuantizationType.Q6_K} <= types


def test_metadata_and_default_tokenizer(tmp_path):
    path = tool.write_random_gguf(tmp_path / "tiny.gguf", "tiny", "Q4_K_M")
    fields = gguf.GGUFReader(path).fields

    def value(key):
        return fields[key].contents()

    assert value("general.architecture") == "llama"
    assert value("llama.embedding_length") == TINY.hidden
    assert value("llama.block_count") == TINY.layers
    assert value("llama.attention.head_count_kv") == TINY.kv_heads
    assert value("llama.rope.freq_base") == tool.ROPE_THETA
    assert value("llama.vocab_size") == 49152
    # The default model's tokenizer fields (as the tool read them), with their value types.
    default = tool.tokenizer_fields()
    assert [key for key, *_ in default] == [key for key in fields if key.startswith("tokenizer.")]
    for key, default_value, vtype, sub_type in default:
        assert fields[key].types == ([vtype, sub_type] if sub_type else [vtype]), key
        assert value(key) == default_value, key


def test_rows_not_a_multiple_of_256_use_llama_cpp_fallbacks():
    # Qwen2.5-0.5B's hidden size, 896, is not a multiple of the K-quants' 256 (its 4864 is).
    tensors = tool._plan(tool.SHAPES["0.5b"], 49152, "Q4_K_M")
    types = {t.name: t.type.name for t in tensors}
    assert types["token_embd.weight"] == "Q8_0"  # Q6_K, as the tied output
    assert types["blk.0.attn_v.weight"] == "Q8_0"  # Q6_K (more bits)
    assert types["blk.3.attn_v.weight"] == "Q5_0"  # Q4_K
    assert types["blk.0.ffn_down.weight"] == "Q6_K"
    assert types["blk.3.ffn_down.weight"] == "Q4_K"
