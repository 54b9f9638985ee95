"""A model directory whose v4 config.json scales its rope (Phi-3-128k's longrope, Llama
3.1's llama3, Qwen's yarn) loads its tokenizer: transformers 5's generic config class,
which load_tokenizer hands AutoTokenizer, fails on such a `rope_scaling`."""

from __future__ import annotations

import json
import shutil

import pytest

from braid.runtime.text.tokenizer import load_tokenizer

# The rope fields of each kind as the real models' v4 config.json write them (Phi-3 keeps its
# original context at the top level).
SCALINGS = {
    "longrope": {
        "original_max_position_embeddings": 4096,
        "rope_scaling": {
            "type": "longrope",
            "short_factor": [1.0] * 32,
            "long_factor": [4.0] * 32,
        },
    },
    "llama3": {
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
    },
    "yarn": {
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    },
}


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_a_v4_rope_scaling_loads_the_tokenizer(kind, default_model_path, tmp_path):
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_path / name, tmp_path / name)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["rope_parameters"]  # v5's spelling
    config |= {"max_position_embeddings": 131072, "rope_theta": 10000.0, **SCALINGS[kind]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    want = load_tokenizer(default_model_path)
    assert load_tokenizer(tmp_path).get_vocab() == want.get_vocab()
