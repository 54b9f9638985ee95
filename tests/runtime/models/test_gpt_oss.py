"""GPT-OSS (attention sinks, alternating sliding-window layers, YaRN, its router and clamped
SwiGLU experts) against transformers on a tiny random model whose prompts run past the window:
logits, greedy tokens through the engine, ragged batches over shared prefixes, the Triton
path, the server with a harmony-shaped chat template, and OpenAI's MXFP4 checkpoint
layout."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from family_models import (
    OPS,
    ours,
    random_ids,
    reference,
    reference_logits,
    tiny_model,
)
from safetensors.torch import load_file, save_file

from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.loading.model_loader import load_model, load_model_config
from braid.runtime.models.config.model_config import ModelConfig

WINDOW = 8
TINY = dict(
    hidden_size=64,
    intermediate_size=32,
    head_dim=16,
    num_hidden_layers=4,  # sliding, full, sliding, full (transformers' default layer_types)
    num_attention_heads=4,
    num_key_value_heads=2,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=WINDOW,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    swiglu_limit=2.0,  # low enough that random gates and ups reach it
    # YaRN with a short original context, so prompts run past it and every band of the ramp
    # (kept, blended, interpolated) is used.
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 8.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 64,
    },
    architectures=["GptOssForCausalLM"],
)


# The shape of GPT-OSS's own (harmony) template, less its developer, tools and reasoning
# branches.
HARMONY_TEMPLATE = (
    "<|start|>system<|message|>You are ChatGPT, a large language model.\nReasoning: low<|end|>"
    "{% for message in messages %}<|start|>{{ message['role'] }}<|message|>"
    "{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)


def _randomize(name: str, p: torch.nn.Parameter) -> None:
    """Norms, routers, sinks and biases random; the experts' gate/up wide enough to clamp."""
    if "norm" in name:
        p.normal_(1.0, 0.3)
    elif "router" in name or name.endswith("sinks") or name.endswith("bias"):
        p.normal_(0.0, 0.5)
    elif name.endswith("gate_up_proj"):
        p.normal_(0.0, 0.3)
    elif name.endswith("down_proj"):
        p.normal_(0.0, 0.1)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory, default_model_path):
    directory = tmp_path_factory.mktemp("tiny-gpt-oss")
    return tiny_model(
        directory, default_model_path, transformers.GptOssConfig, TINY, _randomize,
        HARMONY_TEMPLATE,
    )  # fmt: skip


def test_config_reads_windows_experts_and_yarn(model_path):
    config = load_model_config(model_path)
    assert config.architecture == "GptOssForCausalLM" and config.attention_bias
    assert config.layer_windows == (WINDOW, None, WINDOW, None)
    moe = config.moe
    assert (moe.num_experts, moe.top_k, moe.intermediate_size) == (4, 2, 32)
    assert (moe.swiglu_alpha, moe.swiglu_limit) == (1.702, 2.0)
    assert config.rope_parameters["rope_type"] == "yarn"
    assert config.rope_parameters["truncate"] is False


def test_config_defaults_are_transformers(model_path, tmp_path):
    """A config.json without the keys GPT-OSS defaults (rope, window, layer types, biases,
    SwiGLU) reads as transformers' GptOssConfig fills them; without a head size, through
    transformers (its default is not hidden / heads)."""
    raw = json.loads((model_path / "config.json").read_text())
    for key in (
        "rope_parameters", "sliding_window", "layer_types", "attention_bias", "swiglu_limit",
        "swiglu_alpha",
    ):  # fmt: skip
        del raw[key]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    got = load_model_config(tmp_path)
    want = ModelConfig.from_hf(transformers.GptOssConfig.from_pretrained(tmp_path))
    assert got == want
    assert got.layer_windows == (128, None, 128, None) and got.attention_bias
    assert got.rope_parameters["rope_theta"] == 150000.0
    del raw["head_dim"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert load_model_config(tmp_path).head_dim == 64


def test_clamps_reach_the_limit(model_path):
    """The random experts' gate/up projections pass the limit, so the clamps are tested."""
    ref = reference(model_path)
    ids = torch.tensor([random_ids(ref.config, 24, seed=1)])
    seen = []
    experts = ref.model.layers[0].mlp.experts
    hook = experts.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    with torch.no_grad():
        ref(ids)
    hook.remove()
    gate_up = seen[0] @ experts.gate_up_proj[0] + experts.gate_up_proj_bias[0]
    assert (gate_up[:, 0::2] > 2.0).any() and (gate_up[:, 1::2].abs() > 2.0).any()


@OPS
def test_logits_past_the_window_match_transformers(model_path, cpu_kernels):
    config, model, kv = ours(model_path, cpu_kernels, poison_unwritten=True)
    ids = random_ids(config, 4 * WINDOW, seed=1)
    batch = ForwardBatch.build([ids], [kv.allocate(len(ids))], logits_rows=[list(range(len(ids)))])
    want = reference_logits(reference(model_path), ids)
    torch.testing.assert_close(model(batch, kv), want, atol=1e-4, rtol=0)


@OPS
def test_greedy_tokens_match_transformers(model_path, cpu_kernels):
    """Greedy generation through the engine (radix cache, scheduler, decodes past the window):
    the same tokens as transformers' generate, in float32."""
    from braid.runtime import Engine, SamplingParams

    ref = reference(model_path)
    prompt = random_ids(ref.config, 17, seed=2)
    want = ref.generate(
        torch.tensor([prompt]), max_new_tokens=12, do_sample=False, min_new_tokens=12
    )[0, len(prompt) :].tolist()
    engine = Engine(
        model=str(model_path), dtype="float32", cpu_kernels=cpu_kernels, quantization="none"
    )
    try:
        out = engine.generate(prompt, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    finally:
        engine.shutdown()
    assert out.token_ids == want


@OPS
def test_bfloat16_logits_close_to_transformers(model_path, cpu_kernels):
    """Our bfloat16 logits are as close to the float32 ones as transformers' bfloat16 logits
    are (this random model's activations are large: bfloat16 alone moves its logits by
    several percent)."""
    config, model, kv = ours(model_path, cpu_kernels, dtype=torch.bfloat16)
    ids = random_ids(config, 3 * WINDOW, seed=3)
    batch = ForwardBatch.build([ids], [kv.allocate(len(ids))], logits_rows=[list(range(len(ids)))])
    got = model(batch, kv).float()
    exact = reference_logits(reference(model_path), ids)
    theirs = reference_logits(reference(model_path, torch.bfloat16), ids)
    assert (got - exact).abs().max() < 1.5 * (theirs - exact).abs().max()
    assert (got - theirs).abs().max() / theirs.abs().max() < 0.1


@OPS
def test_ragged_batch_over_a_shared_prefix_gives_each_row_its_own(model_path, cpu_kernels):
    """Decodes sharing a prefix longer than the window, a chunk over the cached prefix and
    fresh prefills of different lengths in one forward (the experts see all their tokens
    together): each row as transformers gives it alone."""
    config, model, kv = ours(model_path, cpu_kernels, poison_unwritten=True)
    ref = reference(model_path)
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
    fresh = [random_ids(config, n, seed=10 + n) for n in (5, 2 * WINDOW + 3)]
    tables += [torch.cat([prefix_slots, kv.allocate(len(chunk))])]
    tables += [kv.allocate(len(f)) for f in fresh]
    new = [[t[-1]] for t in tails] + [chunk, *fresh]
    got = model(ForwardBatch.build(new, tables, logits_rows=[list(range(len(n))) for n in new]), kv)
    seqs = [prefix + t for t in tails] + [prefix + chunk, *fresh]
    for rows, seq, n in zip(got.split([len(n) for n in new]), seqs, new, strict=True):
        torch.testing.assert_close(rows, reference_logits(ref, seq)[-len(n) :], atol=1e-4, rtol=0)


def test_batch_sharing_a_prefix_through_the_radix_cache(model_path):
    """Requests of different lengths sharing a prefix three windows long, sent together and
    after each other, give transformers' greedy tokens; the later ones reuse the cached
    prefix."""
    from braid.runtime import Engine, SamplingParams

    ref = reference(model_path)
    prefix = random_ids(ref.config, 3 * WINDOW, seed=13)
    prompts = [prefix + random_ids(ref.config, n, seed=14 + n) for n in (1, 5, 9)]
    want = [
        ref.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False, min_new_tokens=8)[
            0, len(p) :
        ].tolist()
        for p in prompts
    ]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    engine = Engine(model=str(model_path), dtype="float32", quantization="none")
    try:
        together = engine.generate(prompts, params)
        again = [engine.generate(p, params) for p in prompts]
        assert engine.stats()["cached_tokens"] >= 3 * len(prefix)
    finally:
        engine.shutdown()
    assert [o.token_ids for o in together] == want
    assert [o.token_ids for o in again] == want


def test_triton_path_past_the_window_matches_transformers(model_path):
    """The CUDA path's kernels with sinks (in triton's interpreter without a GPU): a prefill
    chunk, a chunk over the cached prefix and a decode, past the window."""
    from braid.runtime.models.layers.ops import TRITON_OPS

    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = load_model_config(model_path)
    model = load_model(model_path, config, torch.float32, torch.device(device), cpu_kernels=False)
    model.ops = TRITON_OPS
    kv = KVPool(config.num_layers, 128, config.num_kv_heads, config.head_dim, torch.float32, device)
    ids = random_ids(config, 2 * WINDOW + 4, seed=16)
    expected = reference_logits(reference(model_path), ids)
    slots = kv.allocate(len(ids))
    for start, end in [(0, 11), (11, 2 * WINDOW + 2), (2 * WINDOW + 2, 2 * WINDOW + 3)]:
        batch = ForwardBatch.build(
            [ids[start:end]], [slots[:end]], logits_rows=[list(range(end - start))], device=device
        )
        got = model(batch, kv).cpu()
        torch.testing.assert_close(got, expected[start:end], atol=1e-3, rtol=0)


def test_chat_through_the_server_with_the_harmony_template(model_path):
    """/v1/chat/completions renders the model's own template; the completion is what the
    engine gives for the rendered prompt (longer than the window)."""
    import httpx
    from conftest import LiveServer

    from braid.runtime import Engine, SamplingParams

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
    messages = [{"role": "user", "content": "What does an attention sink do?"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "<|start|>user<|message|>" in rendered and rendered.endswith("<|start|>assistant")
    engine = Engine(model=str(model_path), dtype="float32", quantization="none")
    server = LiveServer(engine)
    try:
        r = httpx.post(
            server.url + "/v1/chat/completions",
            json={"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        text = r.json()["choices"][0]["message"]["content"]
        ids = tokenizer(rendered, add_special_tokens=False).input_ids
        assert len(ids) > WINDOW
        want = engine.generate(ids, SamplingParams(max_tokens=8, temperature=0)).text
    finally:
        server.stop()
        engine.shutdown()
    assert text == want


def _mxfp4(w: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random MXFP4 blocks and scales of `w`'s shape in our layout, [E, rows, in]: uint8
    [E, rows, in / 32, 16] and [E, rows, in / 32], exponents near the weights' size."""
    g = torch.Generator().manual_seed(seed)
    e, rows, cols = w.shape
    blocks = torch.randint(0, 256, (e, rows, cols // 32, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(122, 126, (e, rows, cols // 32), generator=g, dtype=torch.uint8)
    return blocks, scales


def test_mxfp4_checkpoint_loads_as_its_dequantized_weights(model_path, tmp_path):
    """OpenAI's layout (experts as MXFP4 blocks and scales, quantization_config mxfp4) gives
    transformers' logits over the same experts dequantized by transformers."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    weights = load_file(model_path / "model.safetensors")
    floats, packed = dict(weights), dict(weights)
    for name in [n for n in weights if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales = _mxfp4(weights[name].transpose(1, 2), seed=len(name))
        floats[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
        assert floats[name].shape == weights[name].shape
        del packed[name]
        packed[name + "_blocks"], packed[name + "_scales"] = blocks, scales
    dense, mxfp4 = tmp_path / "dense", tmp_path / "mxfp4"
    for directory, tensors in ((dense, floats), (mxfp4, packed)):
        shutil.copytree(model_path, directory)
        save_file(tensors, directory / "model.safetensors")
    config_json = json.loads((mxfp4 / "config.json").read_text())
    config_json["quantization_config"] = {"quant_method": "mxfp4"}
    (mxfp4 / "config.json").write_text(json.dumps(config_json))
    config, model, kv = ours(mxfp4, cpu_kernels=True)
    ids = random_ids(config, 2 * WINDOW, seed=17)
    batch = ForwardBatch.build([ids], [kv.allocate(len(ids))], logits_rows=[list(range(len(ids)))])
    want = reference_logits(reference(dense), ids)
    assert not torch.allclose(want, reference_logits(reference(model_path), ids), atol=1e-2)
    torch.testing.assert_close(model(batch, kv), want, atol=1e-4, rtol=0)


def test_unsupported_variants_are_refused_clearly(model_path, tmp_path):
    directory = tmp_path / "bnb"
    shutil.copytree(model_path, directory)
    config_json = json.loads((directory / "config.json").read_text())
    config_json["quantization_config"] = {"quant_method": "bitsandbytes"}
    (directory / "config.json").write_text(json.dumps(config_json))
    with pytest.raises(ValueError, match="GptOssForCausalLM quantized as 'bitsandbytes'"):
        load_model_config(directory)


def test_int8_experts_keep_their_biases(model_path):
    """quantization="int8": the experts' matrices become blocks, their biases stay floats;
    each expert's output stays within int8's rounding of the float expert's. (The whole
    model's logits are not compared: a rounding that flips one of this random router's
    near-ties changes them by more.)"""
    config = load_model_config(model_path)
    cpu = torch.device("cpu")
    floats = load_model(model_path, config, torch.float32, cpu)
    blocks = load_model(model_path, config, torch.float32, cpu, quantization="int8")
    x = torch.randn(5, config.hidden_size, generator=torch.Generator().manual_seed(0))
    for layer in range(config.num_layers):
        want_experts = floats.layers[layer].mlp.experts
        got_experts = blocks.layers[layer].mlp.experts
        assert got_experts.gate_up[0].fmt == "q8"
        for e in range(config.moe.num_experts):
            want = want_experts.run(e, x, floats.ops)
            got = got_experts.run(e, x, blocks.ops)
            assert 0 < (got - want).abs().max() / want.abs().max() < 0.03
