"""Mixture-of-experts decoders (Qwen3-MoE, Qwen2-MoE with its shared expert, Mixtral, OLMoE)
against transformers on tiny random models: logits, greedy tokens through the engine, and a
batch mixing many tokens whose rows each get what they get alone."""

from __future__ import annotations

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

TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    num_experts_per_tok=2,
)
VARIANTS = {
    # A dense layer among the sparse ones (mlp_only_layers), renormalised top-k.
    "qwen3_moe": (
        transformers.Qwen3MoeConfig,
        dict(
            num_experts=8,
            moe_intermediate_size=32,
            head_dim=16,
            norm_topk_prob=True,
            mlp_only_layers=[1],
        ),
    ),  # fmt: skip
    # The shared expert and its gate; every second layer sparse (decoder_sparse_step).
    "qwen2_moe": (
        transformers.Qwen2MoeConfig,
        dict(
            num_experts=6,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            decoder_sparse_step=2,
        ),
    ),  # fmt: skip
    "mixtral": (transformers.MixtralConfig, dict(num_local_experts=4)),
    # q/k norms over all heads, q/k/v clamped.
    "olmoe": (transformers.OlmoeConfig, dict(num_experts=8, clip_qkv=3.0, norm_topk_prob=False)),
    # As llama.cpp reads "qwen3moe" and "qwen2moe" GGUFs (runtime/loading/gguf/files.py): every
    # layer sparse, Qwen3-MoE's top-k renormalised, Qwen2-MoE's not.
    "qwen3_moe-gguf": (
        transformers.Qwen3MoeConfig,
        dict(num_experts=8, moe_intermediate_size=32, head_dim=16, norm_topk_prob=True),
    ),
    "qwen2_moe-gguf": (
        transformers.Qwen2MoeConfig,
        dict(num_experts=6, moe_intermediate_size=32, shared_expert_intermediate_size=64),
    ),
}
GGUF_VARIANTS = ["qwen3_moe-gguf", "qwen2_moe-gguf"]


def _random_norms_and_routers(name: str, p: torch.nn.Parameter) -> None:
    if "norm" in name:
        p.normal_(1.0, 0.3)
    elif name.endswith("gate.weight"):  # the routers
        p.normal_(0.0, 0.5)


@pytest.fixture(scope="session")
def make_model(tmp_path_factory, default_model_path):
    """Build (once per variant) a tiny random model as an HF directory with the default
    model's tokenizer; norms and routers random enough that routing differs by token."""
    built = {}

    def make(variant: str):
        if variant not in built:
            config_cls, extra = VARIANTS[variant]
            directory = tmp_path_factory.mktemp(f"tiny-{variant}")
            built[variant] = tiny_model(
                directory, default_model_path, config_cls, TINY | extra, _random_norms_and_routers
            )
        return built[variant]

    return make


def test_config_reads_the_experts(make_model):
    config = load_model_config(make_model("qwen3_moe"))
    assert config.architecture == "Qwen3MoeForCausalLM" and config.qk_norm
    moe = config.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size) == (8, 2, 32)
    assert moe.sparse_layers == (True, False, True) and moe.norm_topk_prob
    moe = load_model_config(make_model("qwen2_moe")).moe
    assert moe.sparse_layers == (False, True, False) and moe.shared_intermediate_size == 48
    config = load_model_config(make_model("olmoe"))
    assert config.layer_windows == () and config.moe.clip_qkv == 3.0


@OPS
@pytest.mark.parametrize("variant", list(VARIANTS)[:4])
def test_logits_match_transformers(make_model, variant, cpu_kernels):
    path = make_model(variant)
    config, model, kv = ours(path, cpu_kernels)
    ids = random_ids(config, 24, seed=1)
    batch = ForwardBatch.build([ids], [kv.allocate(len(ids))], logits_rows=[list(range(len(ids)))])
    want = reference_logits(reference(path), ids)
    torch.testing.assert_close(model(batch, kv), want, atol=1e-4, rtol=0)


@OPS
@pytest.mark.parametrize("variant", list(VARIANTS)[:4])
def test_greedy_tokens_match_transformers(make_model, variant, cpu_kernels):
    """Greedy generation through the engine (radix cache, scheduler): the same tokens as
    transformers' generate, in float32."""
    from braid.runtime import Engine, SamplingParams

    path = make_model(variant)
    ref = reference(path)
    prompt = random_ids(ref.config, 17, seed=2)
    want = ref.generate(
        torch.tensor([prompt]), max_new_tokens=12, do_sample=False, min_new_tokens=12
    )[0, len(prompt) :].tolist()
    engine = Engine(model=str(path), dtype="float32", cpu_kernels=cpu_kernels)
    try:
        out = engine.generate(prompt, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    finally:
        engine.shutdown()
    assert out.token_ids == want


@pytest.mark.parametrize("variant", list(VARIANTS)[:4])
def test_bfloat16_logits_close_to_transformers(make_model, variant):
    path = make_model(variant)
    config, model, kv = ours(path, cpu_kernels=True, dtype=torch.bfloat16)
    ids = random_ids(config, 24, seed=3)
    batch = ForwardBatch.build([ids], [kv.allocate(len(ids))], logits_rows=[list(range(len(ids)))])
    got = model(batch, kv).float()
    want = reference_logits(reference(path, torch.bfloat16), ids)
    assert (got - want).abs().max() / want.abs().max() < 0.05


@OPS
@pytest.mark.parametrize("variant", ["qwen2_moe", "olmoe"])
def test_batch_of_many_tokens_gives_each_row_its_own(make_model, variant, cpu_kernels):
    """Decodes over cached prompts, a chunk over a cached prompt and fresh prefills in one
    forward (the experts see all their tokens together): each row as it is alone."""
    path = make_model(variant)
    config, model, kv = ours(path, cpu_kernels)
    ref = reference(path)
    prompts = [random_ids(config, n, seed=10 + n) for n in (5, 9, 13)]
    tables = []
    for prompt in prompts:
        slots = kv.allocate(len(prompt) + 1)
        model(ForwardBatch.build([prompt], [slots[:-1]]), kv)
        tables.append(slots)
    new = [random_ids(config, 1, seed=20 + i) for i in range(3)]
    chunk = random_ids(config, 7, seed=30)
    chunk_table = torch.cat([tables[1][:-1], kv.allocate(len(chunk))])
    fresh = [random_ids(config, n, seed=40 + n) for n in (11, 19)]
    fresh_tables = [kv.allocate(len(f)) for f in fresh]
    rows = new + [chunk] + fresh
    batch = ForwardBatch.build(
        rows, tables + [chunk_table] + fresh_tables, logits_rows=[list(range(len(r))) for r in rows]
    )
    got = model(batch, kv)
    seqs = [p + n for p, n in zip(prompts, new, strict=True)] + [prompts[1] + chunk] + fresh
    for out, seq, r in zip(got.split([len(r) for r in rows]), seqs, rows, strict=True):
        torch.testing.assert_close(out, reference_logits(ref, seq)[-len(r) :], atol=1e-4, rtol=0)


# (The tiny Qwen2-MoE's shared expert is 48 wide: not whole int4 blocks of 32.)
@pytest.mark.parametrize(
    "variant, quantization",
    [("qwen3_moe", "int8"), ("qwen2_moe", "int8"), ("mixtral", "int8"), ("qwen3_moe", "int4")],
)
def test_int8_and_int4_experts_stay_near_the_floats(make_model, variant, quantization):
    """quantization="int8"/"int4" keeps every expert as blocks (routers in floats): the
    logits stay within the formats' rounding of the float model's."""
    from braid.runtime.models.moe import QuantExperts

    path = make_model(variant)
    config = load_model_config(path)
    cpu = torch.device("cpu")
    floats = load_model(path, config, torch.float32, cpu)
    blocks = load_model(path, config, torch.float32, cpu, quantization=quantization)
    experts = [m for m in blocks.modules() if isinstance(m, QuantExperts)]
    assert len(experts) == sum(config.moe.sparse_layers)
    kv = KVPool(config.num_layers, 512, config.num_kv_heads, config.head_dim, torch.float32, "cpu")
    ids = random_ids(config, 24, seed=5)
    want, got = prompt_logits(floats, kv, ids), prompt_logits(blocks, kv, ids)
    error = (got - want).abs().max() / want.abs().max()
    assert 0 < error < {"int8": 0.03, "int4": 0.2}[quantization]


@pytest.fixture(scope="module")
def moe_gguf(make_model, tmp_path_factory):
    """The GGUF variants' weights as llama.cpp's converter writes them: F32 and Q8_0."""
    from conftest import hf_gguf

    out = tmp_path_factory.mktemp("moe-gguf")
    files = {}
    for variant in GGUF_VARIANTS:
        path = make_model(variant)
        for t in ("F32", "Q8_0"):
            files[variant, t] = hf_gguf().write_moe_gguf(out / f"{variant}-{t}.gguf", path, t)
    return files


@pytest.mark.parametrize("variant", GGUF_VARIANTS)
def test_gguf_gives_the_hf_config_and_logits(make_model, moe_gguf, variant, tmp_path, monkeypatch):
    """The F32 file gives transformers' logits; the Q8_0 file with its experts' blocks kept
    (a QuantLinear per expert over the stacked tensors) gives them closely."""
    from braid.runtime.loading.model_loader import resolve_model_dir
    from braid.runtime.models.moe import QuantExperts

    monkeypatch.setenv("BRAID_MODEL_CACHE", str(tmp_path))
    hf = make_model(variant)
    converted = resolve_model_dir(moe_gguf[variant, "F32"])
    want = load_model_config(hf)
    got = load_model_config(converted)
    assert got.moe == want.moe and got.attention_bias == want.attention_bias
    config, model, kv = ours(converted, cpu_kernels=True)
    ids = random_ids(config, 24, seed=17)
    batch = ForwardBatch.build([ids], [kv.allocate(len(ids))], logits_rows=[list(range(len(ids)))])
    expected = reference_logits(reference(hf), ids)
    torch.testing.assert_close(model(batch, kv), expected, atol=1e-4, rtol=0)
    # The F32 file with quantization="gguf": float experts, stacked.
    float_gguf = load_model(
        converted, config, torch.float32, torch.device("cpu"), quantization="gguf"
    )
    kv = KVPool(config.num_layers, 128, config.num_kv_heads, config.head_dim, torch.float32, "cpu")
    batch = ForwardBatch.build([ids], [kv.allocate(len(ids))], logits_rows=[list(range(len(ids)))])
    torch.testing.assert_close(float_gguf(batch, kv), expected, atol=1e-4, rtol=0)
    converted = resolve_model_dir(moe_gguf[variant, "Q8_0"])
    for cpu_kernels in (True, False):
        quant = load_model(
            converted, config, torch.float32, torch.device("cpu"), cpu_kernels, quantization="gguf"
        )
        assert isinstance(quant.layers[0].mlp.experts, QuantExperts)
        kv = KVPool(
            config.num_layers, 128, config.num_kv_heads, config.head_dim, torch.float32, "cpu"
        )
        batch = ForwardBatch.build(
            [ids], [kv.allocate(len(ids))], logits_rows=[list(range(len(ids)))]
        )
        got = quant(batch, kv)
        assert (got - expected).abs().max() < 0.05 * expected.abs().max()


def test_quantized_gguf_experts_through_the_engine(moe_gguf, tmp_path, monkeypatch):
    """Greedy decoding of the Q8_0 file with its blocks kept, through the engine: the tokens
    of the same blocks dequantized to floats."""
    from braid.runtime import Engine, SamplingParams

    monkeypatch.setenv("BRAID_MODEL_CACHE", str(tmp_path))
    path = str(moe_gguf["qwen3_moe-gguf", "Q8_0"])
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    prompt = list(range(100, 117))
    outs = []
    for quantization in ("gguf", "none"):
        engine = Engine(model=path, dtype="float32", quantization=quantization)
        try:
            outs.append(engine.generate(prompt, params).token_ids)
        finally:
            engine.shutdown()
    assert outs[0] == outs[1]


@pytest.mark.slow
@pytest.mark.parametrize("variant", GGUF_VARIANTS)
def test_gguf_logits_match_llama_cpp(moe_gguf, variant, tmp_path, monkeypatch):
    """Our forward over the F32 GGUF against llama.cpp's (llama-cpp-python) on the same file."""
    from braid.runtime.loading.model_loader import resolve_model_dir

    monkeypatch.setenv("BRAID_MODEL_CACHE", str(tmp_path))
    file = moe_gguf[variant, "F32"]
    config, model, kv = ours(resolve_model_dir(file), cpu_kernels=True)
    ids = random_ids(config, 24, seed=18)
    assert_matches_llama_cpp(file, ids, prompt_logits(model, kv, ids), tmp_path)
