"""GPT-OSS from GGUF files laid out as llama.cpp's converter writes them (scripts/hf_gguf.py:
gate and up apart, biases beside every projection, the sinks as attn_sinks): the F32 file reads
as its HF directory (config and transformers' logits); MXFP4 experts stay MXFP4 blocks and give
our float model over the same experts dequantized; Q8_0 blocks with their float biases; greedy
tokens through the engine; and, `slow`, llama.cpp's logits over the same files."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from family_models import (
    assert_matches_llama_cpp,
    prompt_logits,
    random_ids,
    reference,
    reference_logits,
    tiny_model,
)

from braid.runtime.kvcache.pool import KVPool
from braid.runtime.loading.model_loader import load_model, load_model_config, resolve_model_dir
from braid.runtime.models.gpt_oss import GptOssExperts, GptOssQuantExperts
from braid.runtime.models.layers.ops import TORCH_OPS
from braid.runtime.models.layers.quantized import QuantLinear

WINDOW = 8
# As llama.cpp runs GPT-OSS: its fixed SwiGLU limit (7), sliding layers first, YaRN with the
# ramp's ends truncated. Two layers (one sliding, one full) keep the activations' 8-bit
# rounding, ours and llama.cpp's, from compounding past a few percent on random weights.
TINY = dict(
    hidden_size=64,
    intermediate_size=32,
    head_dim=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=WINDOW,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 8.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": True,
        "original_max_position_embeddings": 64,
    },
    architectures=["GptOssForCausalLM"],
)
TYPES = ("F32", "F16", "Q8_0", "MXFP4")


def _randomize(name: str, p: torch.nn.Parameter) -> None:
    """Norms, routers, sinks and biases random; gate/up wide enough to pass the limit of 7."""
    if "norm" in name:
        p.normal_(1.0, 0.3)
    elif "router" in name or name.endswith("sinks") or name.endswith("bias"):
        p.normal_(0.0, 0.5)
    elif name.endswith("gate_up_proj"):
        p.normal_(0.0, 0.8)
    elif name.endswith("down_proj"):
        p.normal_(0.0, 0.1)


@pytest.fixture(scope="module")
def files(tmp_path_factory, default_model_path):
    """The HF directory and its GGUF files, one per type in TYPES."""
    from conftest import hf_gguf

    out = tmp_path_factory.mktemp("gpt-oss-gguf")
    hf = tiny_model(out / "hf", default_model_path, transformers.GptOssConfig, TINY, _randomize)
    paths = {"hf": hf}
    for t in TYPES:
        paths[t] = hf_gguf().write_gpt_oss_gguf(out / f"gpt-oss-{t}.gguf", hf, t)
    return paths


@pytest.fixture(autouse=True)
def _model_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BRAID_MODEL_CACHE", str(tmp_path / "cache"))


def _load(path, quantization: str, cpu_kernels: bool = True):
    converted = resolve_model_dir(path)
    config = load_model_config(converted)
    model = load_model(
        converted,
        config,
        torch.float32,
        torch.device("cpu"),
        cpu_kernels,
        quantization=quantization,
    )
    return config, model


def _logits(model, config, ids: list[int]) -> torch.Tensor:
    kv = KVPool(config.num_layers, 128, config.num_kv_heads, config.head_dim, torch.float32, "cpu")
    return prompt_logits(model, kv, ids)


def test_clamps_reach_the_limit(files):
    """The random experts' gate and up pass llama.cpp's limit of 7, so the clamps are tested."""
    ref = reference(files["hf"])
    seen = []
    experts = ref.model.layers[0].mlp.experts
    hook = experts.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    reference_logits(ref, random_ids(ref.config, 32, seed=40))
    hook.remove()
    gate_up = seen[0] @ experts.gate_up_proj[0] + experts.gate_up_proj_bias[0]
    assert (gate_up[:, 0::2] > 7.0).any() and (gate_up[:, 1::2].abs() > 7.0).any()


def test_f32_gguf_gives_the_hf_config_and_logits(files):
    """The F32 file reads as its HF directory: the same settings (harmony's <|return|> and
    <|call|> ending generation besides the file's eos, as in llama.cpp), and transformers'
    logits past the window, from the file's floats and through the quantized loader."""
    converted = resolve_model_dir(files["F32"])
    want, got = load_model_config(files["hf"]), load_model_config(converted)
    ends = transformers.AutoTokenizer.from_pretrained(converted).convert_tokens_to_ids(
        ["<|return|>", "<|call|>"]
    )
    assert got.eos_token_ids == (*want.eos_token_ids, *ends) and len(set(ends)) == 2
    assert got.architecture == want.architecture == "GptOssForCausalLM"
    assert got.moe == want.moe and got.moe.swiglu_limit == 7.0
    assert got.layer_windows == want.layer_windows == (WINDOW, None)
    assert got.rope_parameters == want.rope_parameters
    assert (got.head_dim, got.attention_bias, got.o_proj_bias) == (16, True, True)
    ids = random_ids(got, 4 * WINDOW, seed=41)
    expected = reference_logits(reference(files["hf"]), ids)
    for quantization in ("none", "gguf"):
        config, model = _load(files["F32"], quantization)
        assert isinstance(model.layers[0].mlp.experts, GptOssExperts)
        torch.testing.assert_close(_logits(model, config, ids), expected, atol=1e-4, rtol=0)


def test_f16_experts_load_as_floats(files):
    """F16 tensors (experts too) load as float parameters, close to transformers' float32
    logits (the weights rounded to 16 bits)."""
    config, model = _load(files["F16"], "gguf")
    assert isinstance(model.layers[0].mlp.experts, GptOssExperts)
    ids = random_ids(config, 3 * WINDOW, seed=42)
    expected = reference_logits(reference(files["hf"]), ids)
    got = _logits(model, config, ids)
    assert (got - expected).abs().max() < 1e-2 * expected.abs().max()


def test_mxfp4_experts_stay_blocks(files):
    """The MXFP4 file with its blocks kept: the experts MXFP4 QuantLinears, one per expert
    (the rest floats, as the file holds them). Through the PyTorch twins (exact products)
    the logits are our float model's over the same experts dequantized; through the CPU
    kernels, which round each expert's input to 8 bits, each expert's output is within that
    rounding of the float expert's, and the logits close."""
    ids = random_ids(load_model_config(resolve_model_dir(files["MXFP4"])), 4 * WINDOW, seed=43)
    config, dense = _load(files["MXFP4"], "none")
    want = _logits(dense, config, ids)
    theirs = reference_logits(reference(files["hf"]), ids)
    assert not torch.allclose(want, theirs, atol=0.1)  # 4 bits moved the experts
    _, exact = _load(files["MXFP4"], "gguf", cpu_kernels=False)
    experts = exact.layers[0].mlp.experts
    assert isinstance(experts, GptOssQuantExperts)
    assert {layer.fmt for layer in [*experts.gate_up, *experts.down]} == {"mxfp4"}
    assert isinstance(exact.layers[0].self_attn.qkv_proj, torch.nn.Linear)
    torch.testing.assert_close(_logits(exact, config, ids), want, atol=1e-4, rtol=0)

    _, kernels = _load(files["MXFP4"], "gguf")
    x = torch.randn(5, config.hidden_size, generator=torch.Generator().manual_seed(0))
    for layer in range(config.num_layers):
        quantized, floats = kernels.layers[layer].mlp.experts, dense.layers[layer].mlp.experts
        assert quantized.gate_up[0].kernels is not None
        for e in range(config.moe.num_experts):
            got, expected = quantized.run(e, x, TORCH_OPS), floats.run(e, x, TORCH_OPS)
            assert (got - expected).abs().max() < 0.02 * expected.abs().max()
    # Logits this flat (the largest about 6) swap near-ties: compared by size, not argmax.
    got = _logits(kernels, config, ids)
    assert (got - want).abs().max() < 0.05 * want.abs().max()
    assert (got - want).abs().mean() < 0.03 * want.abs().mean()


def test_q8_0_blocks_keep_their_float_biases(files):
    """The Q8_0 file: attention and experts as Q8_0 blocks, each with its float bias (the
    router F32, as llama-quantize keeps it); through the PyTorch twins, the logits of the same
    blocks dequantized to floats."""
    ids = random_ids(load_model_config(resolve_model_dir(files["Q8_0"])), 3 * WINDOW, seed=44)
    config, dense = _load(files["Q8_0"], "none")
    _, model = _load(files["Q8_0"], "gguf", cpu_kernels=False)
    layer = model.layers[0]
    assert isinstance(layer.mlp.router, torch.nn.Linear)
    for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj):
        assert isinstance(linear, QuantLinear) and linear.bias is not None
        assert linear.bias.abs().max() > 0.1
    assert isinstance(layer.mlp.experts, GptOssQuantExperts)
    want = _logits(dense, config, ids)
    torch.testing.assert_close(_logits(model, config, ids), want, atol=1e-4, rtol=0)


def test_a_stack_of_formats_adds_its_fused_bias():
    """A fused linear whose parts are stored in different formats (a "_M" mix's q/k and v)
    adds the fused bias once, over all the parts' columns."""
    from braid.runtime.models.layers.quantized import QuantStack

    torch.manual_seed(0)
    parts = [
        QuantLinear.of(torch.nn.Linear(64, n, bias=False), f) for n, f in ((48, "q4"), (16, "q8"))
    ]
    stack = QuantStack(parts, bias=True)
    stack.bias = torch.nn.Parameter(torch.randn(64))
    x = torch.randn(3, 64)
    want = torch.cat([p(x) for p in parts], dim=1) + stack.bias
    torch.testing.assert_close(stack(x), want)


def test_engine_greedy_on_the_mxfp4_blocks(files):
    """Engine(model=file.gguf) runs the MXFP4 blocks (quantization "auto"), through the paged
    KV, the sliding window and decode steps: the greedy tokens of the same blocks run as one
    prefill of the whole sequence for each token."""
    from braid.runtime import Engine, SamplingParams

    prompt = list(range(300, 318))
    engine = Engine(model=str(files["MXFP4"]), dtype="float32")
    try:
        assert engine.config.quantization == "gguf"
        params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
        got = engine.generate(prompt, params).token_ids
    finally:
        engine.shutdown()
    config, model = _load(files["MXFP4"], "gguf")
    want = list(prompt)
    for _ in range(10):
        want.append(int(_logits(model, config, want)[-1].argmax()))
    assert got == want[len(prompt) :]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"swiglu_limit": 2.0}, "swiglu_limit 7.0"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "sliding first"),
        ({"rope_parameters": {**TINY["rope_parameters"], "truncate": False}}, "truncate"),
    ],
)
def test_writer_refuses_what_llama_cpp_cannot_read(files, tmp_path, change, message):
    """llama.cpp has no key for GPT-OSS's SwiGLU limit, its layer pattern or YaRN's
    truncation: a model with other values cannot be written as its file."""
    from conftest import hf_gguf

    other = shutil.copytree(files["hf"], tmp_path / "other")
    config = json.loads((other / "config.json").read_text()) | change
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        hf_gguf().write_gpt_oss_gguf(tmp_path / "other.gguf", other, "F32")


def test_what_llama_cpp_files_may_hold_beyond_this_is_refused(files, monkeypatch):
    """YaRN keys past those GPT-OSS's converter writes (an attention factor), and experts
    with gate and up fused (the converter's --fuse-gate-up-exps), are refused by name."""
    from braid.runtime.loading.gguf import configs as gguf_configs
    from braid.runtime.loading.gguf import files as gguf_file

    read = gguf_configs.metadata
    extra = {"gpt-oss.rope.scaling.yarn_attn_factor": 1.5}
    monkeypatch.setattr(gguf_configs, "metadata", lambda path: read(path) | extra)
    with pytest.raises(ValueError, match="YaRN with gpt-oss.rope.scaling.yarn_attn_factor"):
        resolve_model_dir(files["F32"])
    with pytest.raises(ValueError, match="--fuse-gate-up-exps"):
        gguf_file.hf_name("blk.0.ffn_gate_up_exps.weight", "GptOssForCausalLM")


@pytest.mark.slow
@pytest.mark.parametrize("t", ["F32", "Q8_0", "MXFP4"])
def test_logits_match_llama_cpp(files, t, tmp_path):
    """Our forward over the file (its blocks kept) against llama.cpp's (llama-cpp-python) on
    the same file, past the window: within 1% of the largest logit over the F32 file; within
    5% over the quantized ones, where each rounds the activations to 8 bits its own way (the
    Q8_0 file's attention too: there a near-tie of this flat model's logits may swap)."""
    config, model = _load(files[t], "gguf")
    ids = random_ids(config, 4 * WINDOW, seed=45)
    got = _logits(model, config, ids)
    tolerance = {"F32": 1e-2, "Q8_0": 5e-2, "MXFP4": 5e-2}[t]
    assert_matches_llama_cpp(files[t], ids, got, tmp_path, tolerance, same_argmax=t != "Q8_0")


def test_speculation_on_the_blocks_is_lossless(files):
    """GPT-OSS's quantized experts (their float biases beside them) are batch-invariant, so
    `auto` speculates on them, and n-gram drafts leave greedy and seeded tokens unchanged.
    (The MXFP4 file here keeps its attention in floats, whose GEMMs are not batch-invariant
    outside deterministic mode, which GPT-OSS's experts do not have.)"""
    from braid.runtime import Engine, SamplingParams
    from braid.runtime.spec.lossless import unlike_decode_rows

    prompts = [[300 + i % 7 for i in range(40)], [500 + i % 5 for i in range(30)]]
    config = dict(model=str(files["Q8_0"]), dtype="float32")
    plain = Engine(spec_method="none", **config)
    spec = Engine(spec_method="ngram", spec_draft_length=4, **config)
    try:
        assert unlike_decode_rows(spec.runner.model) is None
        for params in (
            SamplingParams(max_tokens=24, temperature=0, ignore_eos=True),
            SamplingParams(max_tokens=24, temperature=0.8, seed=5, ignore_eos=True),
        ):
            want = [o.token_ids for o in plain.generate(prompts, params)]
            assert [o.token_ids for o in spec.generate(prompts, params)] == want
        assert spec.stats()["spec_accepted_tokens"] > 0
    finally:
        plain.shutdown()
        spec.shutdown()
