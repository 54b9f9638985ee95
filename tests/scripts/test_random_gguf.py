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


@pytest.fixture(scope="module")
def small_tokenizer() -> tuple:
    """The default tokenizer's fields cut to its first tokens: GGUFReader parses every token
    of a file (about 2 s for all 49152), too slow to read back one file per type."""
    return tuple(
        (key, value[:SMALL_VOCAB] if isinstance(value, list) else value, vtype, sub_type)
        for key, value, vtype, sub_type in tool._tokenizer_fields()
    )


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
def test_each_type_reads_back(type, small_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(tool, "_tokenizer_fields", lambda: small_tokenizer)
    path = tool.write_random_gguf(tmp_path / "tiny.gguf", "tiny", type, seed=1)

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
    default = tool._tokenizer_fields()
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


def test_gemma3_from_transformers_as_llama_cpp_lays_it_out(tmp_path):
    """write_gemma3_gguf: llama.cpp's gemma3 names and keys, norms stored as 1 + w, q/k rows
    as transformers has them, Q8_0 matrices."""
    import torch
    import transformers
    from safetensors.numpy import load_file

    vocab = len(next(v for k, v, *_ in tool._tokenizer_fields() if k == "tokenizer.ggml.tokens"))
    config = transformers.Gemma3TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=16,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(config)
    with torch.no_grad():
        model.model.layers[1].post_feedforward_layernorm.weight.normal_()
    model.save_pretrained(tmp_path / "hf")
    path = tool.write_gemma3_gguf(tmp_path / "g.gguf", tmp_path / "hf", "Q8_0")
    reader = gguf.GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == "gemma3"
    assert reader.fields["gemma3.attention.sliding_window"].contents() == 16
    assert reader.fields["gemma3.attention.key_length"].contents() == 32
    tensors = {t.name: t for t in reader.tensors}
    assert "output.weight" not in tensors  # tied
    assert tensors["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    hf = load_file(tmp_path / "hf" / "model.safetensors")
    for name, hf_name in [
        ("blk.1.post_ffw_norm.weight", "model.layers.1.post_feedforward_layernorm.weight"),
        ("blk.0.attn_k_norm.weight", "model.layers.0.self_attn.k_norm.weight"),
    ]:
        np.testing.assert_allclose(tensors[name].data, hf[hf_name] + 1)
    q = gguf.quants.dequantize(tensors["blk.1.attn_q.weight"].data, gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_allclose(q, hf["model.layers.1.self_attn.q_proj.weight"], atol=2e-3)
