"""Phi-3 (fused weights, partial rotary, longrope, its sliding window) and SmolLM3 (NoPE
layers) against transformers, on tiny random models whose prompts run past longrope's
original context and the window; through the engine, the paged KV and the server."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from family_models import (
    OPS,
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
from braid.runtime.loading.model_loader import load_model, load_model_config
from braid.runtime.models.config.model_config import ModelConfig

ORIGINAL = 16  # longrope's original context: the prompts run past it
WINDOW = 8
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
)
# The shape of Phi-3's own template, and a short SmolLM3 one (its own, less the reasoning
# and tools branches).
PHI3_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SMOLLM3_TEMPLATE = (
    "<|im_start|>system\n## Metadata\n\nReasoning Mode: /no_think\n\n<|im_end|>\n"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n\n</think>\n{% endif %}"
)
# Phi-4-mini's partial rotary (0.75 of a head) with longrope past a tiny original context.
PHI_LONGROPE = dict(
    num_hidden_layers=2,
    original_max_position_embeddings=ORIGINAL,
    rope_parameters={
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.75,
        "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
        "long_factor": [1.0, 1.5, 3.0, 6.0, 12.0, 24.0],
    },
    architectures=["Phi3ForCausalLM"],
)
VARIANTS = {
    # With Phi-3-mini's sliding window.
    "phi3": (transformers.Phi3Config, PHI_LONGROPE | dict(sliding_window=WINDOW), PHI3_TEMPLATE),
    # Phi-4-mini's shape: no window (so int8 decodes run in the one-call decoder).
    "phi4-mini": (
        transformers.Phi3Config,
        PHI_LONGROPE | dict(tie_word_embeddings=True),
        PHI3_TEMPLATE,
    ),
    # Every second layer without rope.
    "smollm3": (
        transformers.SmolLM3Config,
        dict(
            num_hidden_layers=4,
            no_rope_layer_interval=2,
            rope_theta=1000.0,
            architectures=["SmolLM3ForCausalLM"],
        ),
        SMOLLM3_TEMPLATE,
    ),
}


def _random_norms(name: str, p: torch.nn.Parameter) -> None:
    if "norm" in name:
        p.normal_(1.0, 0.5)


@pytest.fixture(scope="session")
def make_model(tmp_path_factory, default_model_path):
    """Build (once per variant) a tiny random model as an HF directory, with the default
    model's tokenizer and the family's chat template."""
    built = {}

    def make(variant: str):
        if variant not in built:
            config_cls, extra, template = VARIANTS[variant]
            directory = tmp_path_factory.mktemp(f"tiny-{variant}")
            built[variant] = tiny_model(
                directory, default_model_path, config_cls, TINY | extra, _random_norms, template
            )
        return built[variant]

    return make


def test_config_reads_phi3_and_smollm3_settings(make_model):
    phi = load_model_config(make_model("phi3"))
    assert phi.architecture == "Phi3ForCausalLM" and phi.layer_windows == (WINDOW, WINDOW)
    params = phi.rope_parameters
    assert params["rope_type"] == "longrope" and params["partial_rotary_factor"] == 0.75
    assert params["original_max_position_embeddings"] == ORIGINAL
    smol = load_model_config(make_model("smollm3"))
    assert smol.nope_layers == (1, 3) and smol.layer_windows == ()
    for variant in VARIANTS:  # as from transformers' reading
        path = make_model(variant)
        assert ModelConfig.from_hf(transformers.AutoConfig.from_pretrained(path)) == (
            load_model_config(path)
        )


def test_config_of_a_transformers_v4_phi3_and_smollm3():
    """Phi-3's v4 config.json (rope_scaling of type "su", the original context at the top
    level, no sliding_window key) and SmolLM3's explicit no_rope_layers."""
    base = dict(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, rms_norm_eps=1e-5,
        max_position_embeddings=131072, tie_word_embeddings=False, eos_token_id=1,
    )  # fmt: skip
    phi = base | dict(
        architectures=["Phi3ForCausalLM"],
        original_max_position_embeddings=4096,
        rope_theta=10000.0,
        rope_scaling={"type": "su", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
    )
    c = ModelConfig.from_dict(phi)
    assert c.rope_parameters["rope_type"] == "longrope" and c.layer_windows == ()
    inv_freq, scale = c.rope_inv_freq()  # the long factors: the context is past 4096
    want = 1.0 / (2.0 * 10000.0 ** (torch.arange(0, 16, 2).float() / 16))
    torch.testing.assert_close(inv_freq, want)
    assert scale == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    smol = base | dict(architectures=["SmolLM3ForCausalLM"], no_rope_layers=[1, 0, 0, 1])
    assert ModelConfig.from_dict(smol).nope_layers == (1, 2)
    windowed = smol | dict(use_sliding_window=True, sliding_window=32)
    assert ModelConfig.from_dict(windowed).layer_windows == (None, 32, 32, None)
    with pytest.raises(ValueError, match="no_rope_layers has 2 entries"):
        ModelConfig.from_dict(smol | {"no_rope_layers": [1, 0]})


@OPS
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_and_decode_match_transformers(make_model, variant, cpu_kernels):
    """A prompt past longrope's original context and the window in two chunks, then decode
    steps: every row's logits."""
    path = make_model(variant)
    config, model, kv = ours(path, cpu_kernels)
    ref = reference(path)
    ids = random_ids(config, 2 * ORIGINAL + 4, seed=1)
    expected = reference_logits(ref, ids)
    slots = kv.allocate(len(ids))
    pieces = [(0, 13), (13, ORIGINAL + 9), *((i, i + 1) for i in range(ORIGINAL + 9, len(ids)))]
    for start, end in pieces:
        batch = ForwardBatch.build(
            [ids[start:end]], [slots[:end]], logits_rows=[list(range(end - start))]
        )
        torch.testing.assert_close(model(batch, kv), expected[start:end], atol=1e-4, rtol=0)


@OPS
@pytest.mark.parametrize("variant", ["phi3", "smollm3"])
def test_greedy_tokens_match_transformers(make_model, variant, cpu_kernels):
    """Greedy generation through the engine (paged KV, radix cache, scheduler) from a prompt
    longer than longrope's original context: the same tokens as transformers' generate."""
    from braid.runtime import Engine, SamplingParams

    path = make_model(variant)
    ref = reference(path)
    prompt = random_ids(ref.config, ORIGINAL + 5, seed=2)
    want = ref.generate(
        torch.tensor([prompt]), max_new_tokens=12, do_sample=False, min_new_tokens=12
    )[0, len(prompt) :].tolist()
    engine = Engine(model=str(path), dtype="float32", cpu_kernels=cpu_kernels)
    try:
        out = engine.generate(prompt, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    finally:
        engine.shutdown()
    assert out.token_ids == want


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_bfloat16_logits_close_to_transformers(make_model, variant):
    path = make_model(variant)
    config, model, kv = ours(path, cpu_kernels=True, dtype=torch.bfloat16)
    ref = reference(path, torch.bfloat16)
    ids = random_ids(config, ORIGINAL + 8, seed=3)
    batch = ForwardBatch.build([ids], [kv.allocate(len(ids))], logits_rows=[list(range(len(ids)))])
    got = model(batch, kv).float()
    want = reference_logits(ref, ids)
    assert (got - want).abs().max() / want.abs().max() < 0.05


def test_phi3_short_sequences_use_the_long_factors(make_model):
    """The documented difference (rope._longrope): below the original context transformers
    rotates with the short factors, braid with the long ones (its context is past it); with
    identical factors the two agree there too."""
    path = make_model("phi3")
    config, model, kv = ours(path, cpu_kernels=True)
    assert config.max_position_embeddings > ORIGINAL
    ids = random_ids(config, ORIGINAL - 2, seed=4)
    batch = ForwardBatch.build([ids], [kv.allocate(len(ids))], logits_rows=[list(range(len(ids)))])
    got = model(batch, kv)
    ref = reference(path)
    ref.config.rope_parameters["short_factor"] = ref.config.rope_parameters["long_factor"]
    ref.model.rotary_emb = type(ref.model.rotary_emb)(ref.config)
    torch.testing.assert_close(got, reference_logits(ref, ids), atol=1e-4, rtol=0)


def test_int8_phi4_mini_decodes_in_the_one_call_decoder(make_model):
    """Phi-4-mini's shape quantized to int8: decode steps run in the fused decoder (its rope
    tables carry the partial rotary and longrope), close to transformers' float logits."""
    path = make_model("phi4-mini")
    config = load_model_config(path)
    model = load_model(path, config, torch.float32, torch.device("cpu"), quantization="int8")
    assert model.decoder is not None
    kv = KVPool(config.num_layers, 256, config.num_kv_heads, config.head_dim, torch.float32, "cpu")
    ids = random_ids(config, ORIGINAL + 6, seed=5)
    want = reference_logits(reference(path), ids)
    slots = kv.allocate(len(ids))
    model(ForwardBatch.build([ids[:-3]], [slots[:-3]]), kv)
    for i in range(len(ids) - 3, len(ids)):
        batch = ForwardBatch.build([ids[i : i + 1]], [slots[: i + 1]])
        assert model.decoder.serves(batch)
        got = model(batch, kv)[0]
        assert (got - want[i]).abs().max() < 0.05 * want[i].abs().max()


@pytest.fixture(scope="module")
def phi3_gguf(make_model, tmp_path_factory):
    """The phi3 and phi4-mini models' weights as llama.cpp's converter writes them (F32)."""
    from conftest import hf_gguf

    out = tmp_path_factory.mktemp("phi3-gguf")
    return {
        v: hf_gguf().write_phi3_gguf(out / f"{v}.gguf", make_model(v), "F32")
        for v in ("phi3", "phi4-mini")
    }


@pytest.mark.parametrize("variant", ["phi3", "phi4-mini"])
def test_phi3_gguf_gives_the_hf_config_and_logits(
    make_model, phi3_gguf, variant, tmp_path, monkeypatch
):
    """A "phi3" GGUF (fused attn_qkv and ffn_up, rope factor tensors, the rotated dimensions,
    the original context, the window) reads as its HF directory: the same settings, the same
    logits past the original context."""
    from braid.runtime.loading.model_loader import resolve_model_dir

    monkeypatch.setenv("BRAID_MODEL_CACHE", str(tmp_path))
    hf = make_model(variant)
    converted = resolve_model_dir(phi3_gguf[variant])
    want, got = load_model_config(hf), load_model_config(converted)
    assert got.architecture == "Phi3ForCausalLM" and got.layer_windows == want.layer_windows
    for key in ("rope_type", "partial_rotary_factor", "original_max_position_embeddings"):
        assert got.rope_parameters[key] == want.rope_parameters[key]
    for key in ("long_factor", "short_factor"):
        assert got.rope_parameters[key] == pytest.approx(want.rope_parameters[key])
    assert got.rope_inv_freq()[1] == pytest.approx(want.rope_inv_freq()[1])
    config, model, kv = ours(converted, cpu_kernels=True)
    ids = random_ids(config, ORIGINAL + 8, seed=6)
    batch = ForwardBatch.build([ids], [kv.allocate(len(ids))], logits_rows=[list(range(len(ids)))])
    torch.testing.assert_close(
        model(batch, kv), reference_logits(reference(hf), ids), atol=1e-4, rtol=0
    )


def test_engine_on_a_phi3_gguf_runs_its_floats(make_model, phi3_gguf, tmp_path, monkeypatch):
    """Engine(model="file.gguf") with quantization="auto" runs a Phi-3 file's floats: the
    tokens of its HF directory."""
    from braid.runtime import Engine, SamplingParams

    monkeypatch.setenv("BRAID_MODEL_CACHE", str(tmp_path))
    prompt = random_ids(load_model_config(make_model("phi3")), ORIGINAL + 3, seed=8)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    outs = []
    for model in (phi3_gguf["phi3"], make_model("phi3")):
        engine = Engine(model=str(model), dtype="float32")
        try:
            outs.append(engine.generate(prompt, params).token_ids)
        finally:
            engine.shutdown()
    assert outs[0] == outs[1]


@pytest.mark.slow
def test_phi3_gguf_logits_match_llama_cpp(phi3_gguf, tmp_path, monkeypatch):
    """Our forward over the Phi-4-mini-shaped GGUF (partial rotary, longrope's long factors:
    llama.cpp's context of 256 is past the original 16) against llama.cpp's on the same file.
    (The windowed phi3 is left out: llama.cpp turns Phi's sliding window off.)"""
    from braid.runtime.loading.model_loader import resolve_model_dir

    monkeypatch.setenv("BRAID_MODEL_CACHE", str(tmp_path))
    config, model, kv = ours(resolve_model_dir(phi3_gguf["phi4-mini"]), cpu_kernels=True)
    ids = random_ids(config, 2 * ORIGINAL, seed=7)
    assert_matches_llama_cpp(phi3_gguf["phi4-mini"], ids, prompt_logits(model, kv, ids), tmp_path)


@pytest.mark.parametrize("variant", ["phi3", "smollm3"])
def test_triton_path_matches_transformers(make_model, variant):
    """The CUDA path's kernels (in triton's interpreter without a GPU) with the partial
    rotary's and the NoPE layers' tables: a prefill chunk, a chunk over it and a decode."""
    from braid.runtime.models.layers.ops import TRITON_OPS

    path = make_model(variant)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = load_model_config(path)
    model = load_model(path, config, torch.float32, torch.device(device), cpu_kernels=False)
    model.ops = TRITON_OPS
    kv = KVPool(config.num_layers, 128, config.num_kv_heads, config.head_dim, torch.float32, device)
    ids = random_ids(config, ORIGINAL + 4, seed=9)
    expected = reference_logits(reference(path), ids)
    slots = kv.allocate(len(ids))
    for start, end in [(0, 11), (11, ORIGINAL + 3), (ORIGINAL + 3, ORIGINAL + 4)]:
        batch = ForwardBatch.build(
            [ids[start:end]], [slots[:end]], logits_rows=[list(range(end - start))], device=device
        )
        got = model(batch, kv).cpu()
        torch.testing.assert_close(got, expected[start:end], atol=1e-3, rtol=0)
