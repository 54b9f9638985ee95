"""GGUF files of the families transformers' GGUF reader does not know (Mixtral as llama.cpp's
"llama" with experts, in its stacked and its old per-expert layout; "olmoe"; "smollm3" with
its NoPE layers) and Phi-3 on its own fused blocks: written from tiny random HF models the way
llama.cpp's converter lays them out (scripts/hf_gguf.py), read back to transformers'
config and logits (F32), run on their quantized blocks (Q8_0) through the model and the
engine, and, `slow`, against llama.cpp on the same Q8_0 file."""

from __future__ import annotations

import pytest
import torch
import transformers
from family_models import (
    assert_matches_llama_cpp,
    ours,
    prompt_logits,
    random_ids,
    reference,
    reference_logits,
    tiny_model,
)

from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.loading.model_loader import load_model, load_model_config, resolve_model_dir
from braid.runtime.models.layers.quantized import QuantLinear
from braid.runtime.models.moe import QuantExperts

TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
)
LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "partial_rotary_factor": 0.75,
    "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
    "long_factor": [1.0, 1.5, 3.0, 6.0, 12.0, 24.0],
}
VARIANTS = {
    "mixtral": (
        transformers.MixtralConfig,
        dict(num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2),
    ),
    # As many key/value heads as query heads, as OLMoE has them (llama.cpp's olmoe reads no
    # other), and no q/k/v clamp (llama.cpp's has none).
    "olmoe": (
        transformers.OlmoeConfig,
        dict(num_hidden_layers=2, num_key_value_heads=4, num_experts=8, num_experts_per_tok=2),
    ),
    # llama.cpp's NoPE layers: every fourth.
    "smollm3": (
        transformers.SmolLM3Config,
        dict(num_hidden_layers=4, no_rope_layer_interval=4, rope_theta=1000.0),
    ),
    # Phi-4-mini's shape: partial rotary, longrope past a tiny original context, no window.
    "phi3": (
        transformers.Phi3Config,
        dict(
            num_hidden_layers=2,
            original_max_position_embeddings=16,
            tie_word_embeddings=True,
            rope_parameters=LONGROPE,
        ),
    ),
}


def _random_norms_and_routers(name: str, p: torch.nn.Parameter) -> None:
    if "norm" in name:
        p.normal_(1.0, 0.3)
    elif name.endswith("gate.weight"):  # the routers
        p.normal_(0.0, 0.5)


@pytest.fixture(scope="module")
def families(tmp_path_factory, default_model_path):
    """Per variant: the HF directory and its GGUF files, F32 and Q8_0 (and Mixtral's old
    per-expert layout of both)."""
    from conftest import hf_gguf

    writer = hf_gguf()
    out = tmp_path_factory.mktemp("gguf-families")
    files = {}
    for variant, (config_cls, fields) in VARIANTS.items():
        hf = tiny_model(
            out / variant, default_model_path, config_cls, TINY | fields, _random_norms_and_routers
        )
        files[variant, "hf"] = hf
        for t in ("F32", "Q8_0"):
            files[variant, t] = writer.write_hf_gguf(out / f"{variant}-{t}.gguf", hf, t)
    for t in ("F32", "Q8_0"):
        path = out / f"mixtral-old-{t}.gguf"
        files["mixtral-old", t] = writer.write_hf_gguf(
            path, files["mixtral", "hf"], t, per_expert=True
        )
    return files


@pytest.fixture(autouse=True)
def _model_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BRAID_MODEL_CACHE", str(tmp_path / "cache"))


def _logits(model, config, ids: list[int]) -> torch.Tensor:
    kv = KVPool(config.num_layers, 128, config.num_kv_heads, config.head_dim, torch.float32, "cpu")
    return prompt_logits(model, kv, ids)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_f32_gguf_gives_the_hf_config_and_logits(families, variant):
    """The F32 file reads as its HF directory: the same settings, transformers' logits, from
    the file's floats and through the quantized loader (which keeps float tensors as they
    are)."""
    hf = families[variant, "hf"]
    converted = resolve_model_dir(families[variant, "F32"])
    want, got = load_model_config(hf), load_model_config(converted)
    assert got.architecture == want.architecture
    assert got.moe == want.moe and got.nope_layers == want.nope_layers
    assert got.layer_windows == want.layer_windows == ()
    assert got.rope_inv_freq()[0] == pytest.approx(want.rope_inv_freq()[0])
    config, model, kv = ours(converted, cpu_kernels=True)
    ids = random_ids(config, 24, seed=31)
    expected = reference_logits(reference(hf), ids)
    torch.testing.assert_close(prompt_logits(model, kv, ids), expected, atol=1e-4, rtol=0)
    kept = load_model(converted, config, torch.float32, torch.device("cpu"), quantization="gguf")
    torch.testing.assert_close(_logits(kept, config, ids), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_q8_0_gguf_runs_its_own_blocks(families, variant):
    """The Q8_0 file with its blocks kept: experts as QuantExperts, Phi-3's fused attn_qkv
    and ffn_up as one QuantLinear each (rows moved for the partial rotary), close to
    transformers' float logits, with and without the CPU kernels."""
    hf = families[variant, "hf"]
    converted = resolve_model_dir(families[variant, "Q8_0"])
    config = load_model_config(converted)
    ids = random_ids(config, 24, seed=32)
    expected = reference_logits(reference(hf), ids)
    for cpu_kernels in (True, False):
        model = load_model(
            converted, config, torch.float32, torch.device("cpu"), cpu_kernels, quantization="gguf"
        )
        layer = model.layers[0]
        assert isinstance(layer.self_attn.qkv_proj, QuantLinear)
        mlp = layer.mlp.experts if config.moe else layer.mlp.gate_up_proj
        assert isinstance(mlp, QuantExperts if config.moe else QuantLinear)
        got = _logits(model, config, ids)
        assert (got - expected).abs().max() < 0.05 * expected.abs().max()
        assert (got.argmax(-1) == expected.argmax(-1)).float().mean() > 0.9


def test_phi3_blocks_decode_in_the_one_call_decoder(families):
    """Phi-4-mini's Q8_0 blocks (no window): decode steps run in the fused decoder and give
    what the layer-by-layer path gives."""
    converted = resolve_model_dir(families["phi3", "Q8_0"])
    config = load_model_config(converted)
    model = load_model(converted, config, torch.float32, torch.device("cpu"), quantization="gguf")
    assert model.decoder is not None
    ids = random_ids(config, 20, seed=33)
    want = _logits(model, config, ids)
    kv = KVPool(config.num_layers, 128, config.num_kv_heads, config.head_dim, torch.float32, "cpu")
    slots = kv.allocate(len(ids))
    model(ForwardBatch.build([ids[:-3]], [slots[:-3]]), kv)
    for i in range(len(ids) - 3, len(ids)):
        batch = ForwardBatch.build([ids[i : i + 1]], [slots[: i + 1]])
        assert model.decoder.serves(batch)
        torch.testing.assert_close(model(batch, kv)[0], want[i], atol=2e-3, rtol=0)


@pytest.mark.parametrize("t", ["F32", "Q8_0"])
def test_old_per_expert_mixtral_reads_as_the_stacked_one(families, t):
    """An old Mixtral file (blk.N.ffn_gate.E.weight per expert) gives the stacked file's
    logits, its quantized experts kept."""
    ids = random_ids(load_model_config(families["mixtral", "hf"]), 16, seed=34)
    outs = []
    for name in ("mixtral", "mixtral-old"):
        converted = resolve_model_dir(families[name, t])
        config = load_model_config(converted)
        model = load_model(
            converted, config, torch.float32, torch.device("cpu"), quantization="gguf"
        )
        assert isinstance(model.layers[0].mlp.experts, QuantExperts) == (t == "Q8_0")
        outs.append(_logits(model, config, ids))
    torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_engine_greedy_on_the_quantized_path(families, variant):
    """Engine(model=file.gguf) runs the Q8_0 blocks (quantization "auto"), through the paged
    KV and its decode steps: the greedy tokens of the same blocks run as one prefill of the
    whole sequence for each token."""
    from braid.runtime import Engine, SamplingParams

    path = families[variant, "Q8_0"]
    prompt = list(range(300, 318))
    engine = Engine(model=str(path), dtype="float32")
    try:
        assert engine.config.quantization == "gguf"
        params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        got = engine.generate(prompt, params).token_ids
    finally:
        engine.shutdown()
    converted = resolve_model_dir(path)
    config = load_model_config(converted)
    model = load_model(converted, config, torch.float32, torch.device("cpu"), quantization="gguf")
    want = list(prompt)
    for _ in range(8):
        want.append(int(_logits(model, config, want)[-1].argmax()))
    assert got == want[len(prompt) :]


def test_smollm3_with_another_nope_pattern_is_refused_by_the_writer(families, tmp_path):
    """llama.cpp has no key for SmolLM3's NoPE layers (every fourth): a model with others
    cannot be written as its file."""
    import json
    import shutil

    from conftest import hf_gguf

    other = shutil.copytree(families["smollm3", "hf"], tmp_path / "other")
    config = json.loads((other / "config.json").read_text())
    config["no_rope_layers"] = [1, 0, 1, 0]
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="every fourth layer NoPE"):
        hf_gguf().write_hf_gguf(tmp_path / "other.gguf", other, "F32")


@pytest.mark.slow
@pytest.mark.parametrize("t", ["F32", "Q8_0"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_match_llama_cpp(families, variant, t, tmp_path):
    """Our forward over the file (the Q8_0 one on its own blocks) against llama.cpp's
    (llama-cpp-python) on the same file: within 1% of the largest logit over the F32 file;
    within 5% over the Q8_0 one, where each rounds the activations to 8 bits its own way
    (either is about 3% from the blocks' exact product on these tiny random models)."""
    file = families[variant, t]
    converted = resolve_model_dir(file)
    config = load_model_config(converted)
    model = load_model(converted, config, torch.float32, torch.device("cpu"), quantization="gguf")
    ids = random_ids(config, 32, seed=35)
    got = _logits(model, config, ids)
    assert_matches_llama_cpp(file, ids, got, tmp_path, tolerance={"F32": 1e-2, "Q8_0": 5e-2}[t])
