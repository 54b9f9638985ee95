"""Reading a model's config.json without transformers' config classes: every field and the
rope frequencies against transformers' own reading of the same file."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from braid.runtime.loading.model_loader import load_model_config
from braid.runtime.models import ModelConfig
from braid.runtime.models.layers import rope

BASE = dict(
    architectures=["LlamaForCausalLM"],
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    eos_token_id=2,
    model_type="llama",
)
# v4-style (rope_scaling beside rope_theta) and v5-style (rope_parameters) configs.
ROPES = {
    "default-v4": dict(rope_theta=123.0),
    "default-v5": dict(rope_parameters=dict(rope_type="default", rope_theta=5e5)),
    "linear": dict(rope_theta=1e4, rope_scaling=dict(type="linear", factor=4.0)),
    "llama3": dict(
        rope_theta=5e5,
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
    ),
    "yarn": dict(
        rope_parameters=dict(
            rope_type="yarn", rope_theta=1e6, factor=4.0, original_max_position_embeddings=1024
        )
    ),
    "yarn-mscale": dict(
        rope_parameters=dict(
            rope_type="yarn",
            rope_theta=1e4,
            factor=40.0,
            mscale=1.0,
            mscale_all_dim=0.707,
            beta_fast=16,
            beta_slow=2,
            original_max_position_embeddings=512,
        )
    ),
    "yarn-no-truncate": dict(
        rope_parameters=dict(
            rope_type="yarn",
            rope_theta=1e4,
            factor=2.0,
            truncate=False,
            attention_factor=1.3,
            original_max_position_embeddings=2048,
        )
    ),
}


def write(tmp_path, **fields) -> dict:
    config = {**BASE, **fields}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return config


@pytest.mark.parametrize("kind", ROPES)
def test_rope_frequencies_match_transformers(tmp_path, kind):
    write(tmp_path, **ROPES[kind])
    ours = load_model_config(tmp_path)
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    rope_type = hf.rope_parameters["rope_type"]
    assert ours.rope_parameters["rope_type"] == rope_type
    got, got_scale = ours.rope_inv_freq()
    if rope_type == "default":
        theta = hf.rope_parameters["rope_theta"]
        want = 1.0 / theta ** (torch.arange(0, 16, 2).float() / 16)
        want_scale = 1.0
    else:
        want, want_scale = ROPE_INIT_FUNCTIONS[rope_type](hf, "cpu")
    torch.testing.assert_close(got, want.float(), rtol=1e-6, atol=0)
    assert got_scale == pytest.approx(want_scale, rel=1e-6)


@pytest.mark.parametrize(
    "arch,fields",
    [
        ("LlamaForCausalLM", dict(head_dim=32, attention_bias=True, eos_token_id=[2, 7])),
        ("MistralForCausalLM", dict(num_key_value_heads=4, rms_norm_eps=1e-6)),
        ("Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
        ("Qwen3ForCausalLM", dict(head_dim=24)),
    ],
)
def test_fields_match_transformers_reading(tmp_path, arch, fields):
    write(
        tmp_path,
        architectures=[arch],
        model_type=arch.removesuffix("ForCausalLM").lower(),
        **fields,
    )
    ours = load_model_config(tmp_path)
    assert ours == ModelConfig.from_hf(transformers.AutoConfig.from_pretrained(tmp_path))


def test_keys_left_out_take_the_architectures_defaults(tmp_path):
    """Qwen3 leaves head_dim at 128 and Mistral eight key/value heads when config.json says
    nothing: such a file is read through transformers, not guessed."""
    config = write(tmp_path, architectures=["Qwen3ForCausalLM"], model_type="qwen3")
    assert load_model_config(tmp_path).head_dim == 128
    del config["num_key_value_heads"]
    config.update(architectures=["MistralForCausalLM"], model_type="mistral")
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_model_config(tmp_path).num_kv_heads == 8


@pytest.mark.parametrize(
    "text,match",
    [
        ("{not json", "cannot read .*config.json"),
        ("[1, 2]", "cannot read .*config.json.*list"),
        (json.dumps({**BASE, "hidden_size": "wide"}), "config.json"),
        (
            json.dumps({**BASE, "rope_scaling": {"type": "dynamic", "factor": 2.0}}),
            "unsupported rope_type 'dynamic'",
        ),
        (
            json.dumps(
                {**BASE, "rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 1.5}}
            ),
            "unsupported partial_rotary_factor",
        ),
    ],
)
def test_bad_config_is_named(tmp_path, text, match):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError, match=match):
        load_model_config(tmp_path)


def test_partial_rotary_factor_beside_the_rope_settings_counts():
    with pytest.raises(ValueError, match="unsupported partial_rotary_factor 1.5"):
        rope.rope_parameters({"rope_theta": 1e4, "partial_rotary_factor": 1.5})
    half = rope.rope_parameters({"rope_theta": 1e4, "partial_rotary_factor": 0.5})
    assert rope.inv_freq(half, 64, 128)[0].shape == (16,)  # half the pairs
    params = rope.rope_parameters({"rope_theta": 1e4, "partial_rotary_factor": 1.0})
    assert params == {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.0}
