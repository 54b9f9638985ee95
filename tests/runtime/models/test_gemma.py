"""Gemma 2 / Gemma 3 and sliding-window attention (Mistral's too) against transformers, on tiny
random models whose prompts run past the window; through the CPU kernels and their torch
twins, the radix cache and the server."""

from __future__ import annotations

import dataclasses
import json

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

WINDOW = 8
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
)
# A Gemma chat template (the shape of Gemma 3's own, without its image and system branches).
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
VARIANTS = {
    # Local layers (window, local rope base) around a global one with linear rope scaling;
    # head_dim 256 as the real models have.
    "gemma3": (
        transformers.Gemma3TextConfig,
        dict(
            head_dim=256,
            num_hidden_layers=3,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            sliding_window=WINDOW,
            query_pre_attn_scalar=24,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
            architectures=["Gemma3ForCausalLM"],
        ),
    ),
    # Soft-caps small enough to matter on random weights.
    "gemma2": (
        transformers.Gemma2Config,
        dict(
            head_dim=16,
            num_hidden_layers=3,
            sliding_window=WINDOW,
            query_pre_attn_scalar=20,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=5.0,
            architectures=["Gemma2ForCausalLM"],
        ),
    ),
    # As llama.cpp reads a "gemma3" GGUF (runtime/loading/gguf/files.py): every sixth layer global,
    # local rope base 10,000, queries scaled by the head size.
    "gemma3-gguf": (
        transformers.Gemma3TextConfig,
        dict(
            head_dim=256,
            num_hidden_layers=6,
            sliding_window=WINDOW,
            query_pre_attn_scalar=256,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
            architectures=["Gemma3ForCausalLM"],
        ),
    ),
    "mistral-window": (
        transformers.MistralConfig,
        dict(head_dim=16, num_hidden_layers=2, sliding_window=WINDOW),
    ),
}


def _random_norms(name: str, p: torch.nn.Parameter) -> None:
    if "norm" in name:
        p.normal_(0.0, 0.5)


@pytest.fixture(scope="session")
def make_model(tmp_path_factory, default_model_path):
    """Build (once per variant) a tiny random model as an HF directory, norms random too (so
    the (1 + w) convention shows), with the default model's tokenizer and a Gemma template."""
    built = {}

    def make(variant: str):
        if variant not in built:
            config_cls, extra = VARIANTS[variant]
            template = GEMMA_TEMPLATE if variant.startswith("gemma") else None
            directory = tmp_path_factory.mktemp(f"tiny-{variant}")
            built[variant] = tiny_model(
                directory, default_model_path, config_cls, TINY | extra, _random_norms, template
            )
        return built[variant]

    return make


def test_config_reads_windows_and_gemma_settings(make_model):
    g3 = load_model_config(make_model("gemma3"))
    assert g3.architecture == "Gemma3ForCausalLM" and g3.head_dim == 256 and g3.qk_norm
    assert g3.layer_windows == (WINDOW, None, WINDOW)
    assert g3.rope_parameters["rope_theta"] == 1e6 and g3.rope_parameters["factor"] == 2.0
    assert g3.local_rope_parameters["rope_theta"] == 1e4
    assert g3.query_pre_attn_scalar == 24
    g2 = load_model_config(make_model("gemma2"))
    assert g2.layer_windows == (WINDOW, None, WINDOW) and not g2.qk_norm
    assert (g2.attn_logit_softcapping, g2.final_logit_softcapping) == (2.0, 5.0)
    assert load_model_config(make_model("mistral-window")).layer_windows == (WINDOW, WINDOW)
    for variant in ("gemma3", "gemma2", "mistral-window"):  # as from transformers' reading
        path = make_model(variant)
        hf = ModelConfig.from_hf(transformers.AutoConfig.from_pretrained(path))
        assert hf == load_model_config(path)


def test_config_of_transformers_v4_gemma3_and_qwen2():
    """A v4 config.json: rope_theta, rope_local_base_freq, rope_scaling, sliding_window_pattern."""
    base = dict(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, rms_norm_eps=1e-6,
        max_position_embeddings=256, tie_word_embeddings=True, eos_token_id=1,
    )  # fmt: skip
    v4 = base | dict(
        architectures=["Gemma3ForCausalLM"],
        rope_theta=1e6,
        rope_local_base_freq=1e4,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
        sliding_window=512,
        sliding_window_pattern=6,
    )
    c = ModelConfig.from_dict(v4)
    assert c.layer_windows == (512,) * 5 + (None,)
    assert c.rope_parameters == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    assert c.local_rope_parameters == {"rope_type": "default", "rope_theta": 1e4}
    # The text model of a multimodal Gemma 3.
    mm = {"architectures": ["Gemma3ForConditionalGeneration"], "eos_token_id": [1, 106]}
    c = ModelConfig.from_dict(
        mm | {"text_config": {k: v for k, v in v4.items() if k != "architectures"}}
    )
    assert c.architecture == "Gemma3ForConditionalGeneration" and c.eos_token_ids == (1, 106)
    qwen = base | dict(architectures=["Qwen2ForCausalLM"], sliding_window=32, max_window_layers=4)
    assert ModelConfig.from_dict(qwen).layer_windows == ()  # use_sliding_window is off
    on = ModelConfig.from_dict(qwen | {"use_sliding_window": True})
    assert on.layer_windows == (None,) * 4 + (32, 32)


def test_unsupported_architecture_names_the_supported_ones():
    with pytest.raises(ValueError, match="unsupported model architecture.*Gemma3ForCausalLM"):
        ModelConfig.from_dict({"architectures": ["PhiForCausalLM"]})


@OPS
@pytest.mark.parametrize("variant", ["gemma3", "gemma2", "mistral-window"])
def test_prefill_and_decode_past_the_window_match_transformers(make_model, variant, cpu_kernels):
    """A prompt four windows long in two chunks, then decode steps: every row's logits."""
    path = make_model(variant)
    config, model, kv = ours(path, cpu_kernels, poison_unwritten=True)
    ref = reference(path)
    ids = random_ids(config, 4 * WINDOW + 4, seed=1)
    expected = reference_logits(ref, ids)
    slots = kv.allocate(len(ids))
    pieces = [(0, 13), (13, 2 * WINDOW + 5), *((i, i + 1) for i in range(2 * WINDOW + 5, len(ids)))]
    for start, end in pieces:
        batch = ForwardBatch.build(
            [ids[start:end]], [slots[:end]], logits_rows=[list(range(end - start))]
        )
        torch.testing.assert_close(model(batch, kv), expected[start:end], atol=1e-4, rtol=0)


@OPS
@pytest.mark.parametrize("variant", ["gemma3", "gemma2", "mistral-window"])
def test_greedy_tokens_match_transformers(make_model, variant, cpu_kernels):
    """Greedy generation through the engine (radix cache, scheduler) from a prompt longer than
    the window: the same tokens as transformers' generate, in float32."""
    from braid.runtime import Engine, SamplingParams

    path = make_model(variant)
    ref = reference(path)
    prompt = random_ids(ref.config, 3 * WINDOW + 1, seed=2)
    want = ref.generate(
        torch.tensor([prompt]), max_new_tokens=12, do_sample=False, min_new_tokens=12
    )[0, len(prompt) :].tolist()
    engine = Engine(model=str(path), dtype="float32", cpu_kernels=cpu_kernels)
    try:
        out = engine.generate(prompt, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    finally:
        engine.shutdown()
    assert out.token_ids == want


@pytest.mark.parametrize("variant", ["gemma3", "gemma2"])
def test_bfloat16_logits_close_to_transformers(make_model, variant):
    path = make_model(variant)
    config, model, kv = ours(path, cpu_kernels=True, dtype=torch.bfloat16, poison_unwritten=True)
    ref = reference(path, torch.bfloat16)
    ids = random_ids(config, 3 * WINDOW, seed=3)
    batch = ForwardBatch.build([ids], [kv.allocate(len(ids))], logits_rows=[list(range(len(ids)))])
    got = model(batch, kv).float()
    want = reference_logits(ref, ids)
    scale = want.abs().max()
    assert (got - want).abs().max() / scale < 0.05


@OPS
@pytest.mark.parametrize("variant", ["gemma3", "gemma2"])
def test_ragged_batch_and_shared_prefix_past_the_window(make_model, variant, cpu_kernels):
    """Decodes sharing a prefix longer than the window (the padded shared-prefix path), a chunk
    over a cached prefix and a fresh prefill in one forward, each as transformers alone."""
    path = make_model(variant)
    config, model, kv = ours(path, cpu_kernels, poison_unwritten=True)
    ref = reference(path)
    prefix = random_ids(config, 3 * WINDOW, seed=4)
    prefix_slots = kv.allocate(len(prefix))
    model(ForwardBatch.build([prefix], [prefix_slots]), kv)
    tails = [random_ids(config, n, seed=5 + n) for n in (1, 3, 2)]
    tables = []
    for tail in tails:
        slots = torch.cat([prefix_slots, kv.allocate(len(tail))])
        if len(tail) > 1:
            model(ForwardBatch.build([tail[:-1]], [slots[:-1]]), kv)
        tables.append(slots)
    chunk = random_ids(config, 11, seed=9)
    fresh = random_ids(config, 2 * WINDOW + 3, seed=10)
    tables += [torch.cat([prefix_slots, kv.allocate(len(chunk))]), kv.allocate(len(fresh))]
    new = [[t[-1]] for t in tails] + [chunk, fresh]
    got = model(ForwardBatch.build(new, tables, logits_rows=[list(range(len(n))) for n in new]), kv)
    seqs = [prefix + t for t in tails] + [prefix + chunk, fresh]
    for rows, seq, n in zip(got.split([len(n) for n in new]), seqs, new, strict=True):
        torch.testing.assert_close(rows, reference_logits(ref, seq)[-len(n) :], atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant", ["gemma3", "gemma2"])
def test_tree_extend_past_the_window_matches_chains(make_model, variant):
    """A draft tree (speculative verification) over a prefix longer than the window: each
    node's logits as transformers' over its own chain."""
    path = make_model(variant)
    config, model, kv = ours(path, cpu_kernels=True, poison_unwritten=True)
    ref = reference(path)
    prefix = random_ids(config, 2 * WINDOW + 2, seed=11)
    prefix_slots = kv.allocate(len(prefix))
    model(ForwardBatch.build([prefix], [prefix_slots]), kv)
    nodes = random_ids(config, 5, seed=12)
    parents = [-1, 0, 0, 1, 3]
    table = torch.cat([prefix_slots, kv.allocate(len(nodes))])
    batch = ForwardBatch.build([nodes], [table], logits_rows=[list(range(5))], parents=[parents])
    got = model(batch, kv)
    for i in range(5):
        chain, j = [], i
        while j >= 0:
            chain.insert(0, nodes[j])
            j = parents[j]
        want = reference_logits(ref, prefix + chain)[-1]
        torch.testing.assert_close(got[i], want, atol=1e-4, rtol=0)


def test_shared_prefix_longer_than_the_window_through_the_radix_cache(make_model):
    """Two requests sharing a prefix three windows long give what each gives alone; the
    second reuses the first's cached KV."""
    from braid.runtime import Engine, SamplingParams

    path = make_model("gemma3")
    config = load_model_config(path)
    prefix = random_ids(config, 3 * WINDOW, seed=13)
    prompts = [prefix + random_ids(config, 5, seed=14), prefix + random_ids(config, 2, seed=15)]
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    alone = []
    for p in prompts:
        engine = Engine(model=str(path), dtype="float32", prefix_cache=False)
        try:
            alone.append(engine.generate(p, params).token_ids)
        finally:
            engine.shutdown()
    engine = Engine(model=str(path), dtype="float32")
    try:
        first = engine.generate(prompts[0], params)
        second = engine.generate(prompts[1], params)
        together = engine.generate(prompts, params)
        assert engine.stats()["cached_tokens"] >= len(prefix)
    finally:
        engine.shutdown()
    assert [first.token_ids, second.token_ids] == alone
    assert [o.token_ids for o in together] == alone


def test_config_json_written_by_transformers_loads(make_model):
    raw = json.loads((make_model("gemma3") / "config.json").read_text())
    assert raw["architectures"] == ["Gemma3ForCausalLM"]


@pytest.mark.parametrize("variant", ["gemma3", "gemma2", "mistral-window"])
def test_triton_path_past_the_window_matches_transformers(make_model, variant):
    """The CUDA path's kernels (in triton's interpreter without a GPU): a prefill chunk, a
    chunk over the cached prefix and decodes, past the window."""
    from braid.runtime.models.layers.ops import TRITON_OPS

    path = make_model(variant)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = load_model_config(path)
    model = load_model(path, config, torch.float32, torch.device(device), cpu_kernels=False)
    model.ops = TRITON_OPS
    kv = KVPool(config.num_layers, 128, config.num_kv_heads, config.head_dim, torch.float32, device)
    ids = random_ids(config, 2 * WINDOW + 4, seed=16)
    expected = reference_logits(reference(path), ids)
    slots = kv.allocate(len(ids))
    for start, end in [(0, 11), (11, 2 * WINDOW + 2), (2 * WINDOW + 2, 2 * WINDOW + 3)]:
        batch = ForwardBatch.build(
            [ids[start:end]], [slots[:end]], logits_rows=[list(range(end - start))], device=device
        )
        got = model(batch, kv).cpu()
        torch.testing.assert_close(got, expected[start:end], atol=1e-3, rtol=0)


@pytest.fixture(scope="module")
def gemma3_gguf(make_model, tmp_path_factory):
    """The gemma3-gguf model's weights as llama.cpp's converter writes them: F32 and Q8_0."""
    from conftest import hf_gguf

    out = tmp_path_factory.mktemp("gemma3-gguf")
    path = make_model("gemma3-gguf")
    return {t: hf_gguf().write_gemma3_gguf(out / f"{t}.gguf", path, t) for t in ("F32", "Q8_0")}


def test_gguf_gives_the_hf_config_and_logits(make_model, gemma3_gguf, tmp_path, monkeypatch):
    from braid.runtime.loading.model_loader import resolve_model_dir

    monkeypatch.setenv("BRAID_MODEL_CACHE", str(tmp_path))
    hf = make_model("gemma3-gguf")
    converted = resolve_model_dir(gemma3_gguf["F32"])
    want = load_model_config(hf)
    got = load_model_config(converted)  # its eps went through a float32
    assert dataclasses.replace(got, rms_norm_eps=want.rms_norm_eps) == want
    config, model, kv = ours(converted, cpu_kernels=True, poison_unwritten=True)
    ids = random_ids(config, 3 * WINDOW, seed=17)
    batch = ForwardBatch.build([ids], [kv.allocate(len(ids))], logits_rows=[list(range(len(ids)))])
    expected = reference_logits(reference(hf), ids)
    torch.testing.assert_close(model(batch, kv), expected, atol=1e-4, rtol=0)
    # The Q8_0 file with its blocks kept (the CPU kernels' quantized matmuls).
    converted = resolve_model_dir(gemma3_gguf["Q8_0"])
    config = load_model_config(converted)
    quant = load_model(converted, config, torch.float32, torch.device("cpu"), quantization="gguf")
    kv = KVPool(config.num_layers, 128, config.num_kv_heads, config.head_dim, torch.float32, "cpu")
    batch = ForwardBatch.build([ids], [kv.allocate(len(ids))], logits_rows=[list(range(len(ids)))])
    got = quant(batch, kv)
    assert (got - expected).abs().max() < 0.05 * expected.abs().max()


@pytest.mark.slow
def test_gguf_logits_match_llama_cpp(gemma3_gguf, tmp_path, monkeypatch):
    """Our forward over the GGUF against llama.cpp's (llama-cpp-python) on the same file,
    every position of a prompt three windows long."""
    from braid.runtime.loading.model_loader import resolve_model_dir

    monkeypatch.setenv("BRAID_MODEL_CACHE", str(tmp_path))
    config, model, kv = ours(
        resolve_model_dir(gemma3_gguf["F32"]), cpu_kernels=True, poison_unwritten=True
    )
    ids = random_ids(config, 3 * WINDOW, seed=18)
    assert_matches_llama_cpp(gemma3_gguf["F32"], ids, prompt_logits(model, kv, ids), tmp_path)


def test_multimodal_gemma3_directory_runs_its_language_model(tmp_path):
    """A Gemma3ForConditionalGeneration directory (text_config, weights under the language
    model's prefix, a vision tower we leave out): text logits as transformers', its eos ids."""
    text = transformers.Gemma3TextConfig(
        vocab_size=1000, head_dim=32, num_hidden_layers=3, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], **TINY,
    )  # fmt: skip
    vision = transformers.SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        image_size=28, patch_size=14,
    )  # fmt: skip
    config = transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=999,
        boi_token_index=998, eoi_token_index=997, eos_token_id=[1, 106],
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.5)
    model.save_pretrained(tmp_path)
    config, ours_model, kv = ours(tmp_path, cpu_kernels=True, poison_unwritten=True)
    assert config.layer_windows == (WINDOW, None, WINDOW) and config.eos_token_ids == (1, 106)
    ids = [i % 990 for i in random_ids(config, 3 * WINDOW, seed=19)]  # no image tokens
    batch = ForwardBatch.build([ids], [kv.allocate(len(ids))], logits_rows=[list(range(len(ids)))])
    torch.testing.assert_close(
        ours_model(batch, kv), reference_logits(reference(tmp_path), ids), atol=1e-4, rtol=0
    )
