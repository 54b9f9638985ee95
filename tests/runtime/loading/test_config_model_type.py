"""A config.json without `architectures` (saved from a config object, as after a GGUF
conversion by transformers) loads by its `model_type`, as transformers' AutoModelForCausalLM
maps it; one whose model_type braid does not run is refused by name."""

from __future__ import annotations

import json
import shutil

import pytest

from braid.runtime import Engine, SamplingParams


def _without_architectures(src, dst, **changes):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    del config["architectures"]
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_the_model_type_names_the_architecture(tiny_model_path, tmp_path):
    bare = _without_architectures(tiny_model_path, tmp_path / "bare")
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outs = []
    for path in (tiny_model_path, bare):
        engine = Engine(model=str(path), device="cpu", dtype="float32", max_kv_tokens=1024)
        try:
            assert engine.model_config.architecture == "LlamaForCausalLM"
            outs.append(engine.generate("Once upon a time", params).token_ids)
        finally:
            engine.shutdown()
    assert outs[0] == outs[1]


def test_an_unsupported_model_type_is_named(tiny_model_path, tmp_path):
    bare = _without_architectures(tiny_model_path, tmp_path / "bert", model_type="bert")
    with pytest.raises(ValueError, match=r"\[.BertLMHeadModel.\] \(model_type .bert.\)"):
        Engine(model=str(bare), device="cpu", dtype="float32", max_kv_tokens=1024)
