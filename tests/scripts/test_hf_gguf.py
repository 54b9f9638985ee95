"""scripts/hf_gguf.py: a tiny transformers model written as llama.cpp's converter lays its
family out (the other families are read back in tests/runtime/loading/test_gguf_families.py,
test_gpt_oss_gguf.py and the models' tests)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from conftest import hf_gguf, random_gguf

pytestmark = pytest.mark.model  # the tool copies the default model's tokenizer


def test_gemma3_from_transformers_as_llama_cpp_lays_it_out(tmp_path):
    """write_gemma3_gguf: llama.cpp's gemma3 names and keys, norms stored as 1 + w, q/k rows
    as transformers has them, Q8_0 matrices."""
    import torch
    import transformers
    from safetensors.numpy import load_file

    vocab = len(
        next(v for k, v, *_ in random_gguf().tokenizer_fields() if k == "tokenizer.ggml.tokens")
    )
    config = transformers.Gemma3TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=16,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(config)
    with torch.no_grad():
        model.model.layers[1].post_feedforward_layernorm.weight.normal_()
    model.save_pretrained(tmp_path / "hf")
    path = hf_gguf().write_gemma3_gguf(tmp_path / "g.gguf", tmp_path / "hf", "Q8_0")
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
