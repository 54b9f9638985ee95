"""Trained draft heads (Medusa, EAGLE-3) with random weights: each head's forward against a
reference written here from the published architecture, both Medusa checkpoint layouts, and
speculation with them lossless on the tiny model (greedy identical to decoding without it,
free, constrained and batched; seeded sampling identical too, since head drafts are point
masses). Bad head directories fail with a ValueError naming the file or tensor.

Random heads accept almost nothing. Trained ones cannot be downloaded here, so acceptance
is not measured: the heads below are built from the target's own output head (Medusa's own
initialisation) plus noise, which makes some drafts right and most wrong - what the parity
tests need to see both verification outcomes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import assert_no_kv_leak, wait_idle
from safetensors.torch import load_file, save_file

from braid.runtime import Engine, SamplingParams
from braid.runtime.spec.heads.medusa import load_medusa

PENALISED = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, frequency_penalty=0.5)
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 4},
    },
    "required": ["name", "age", "tags"],
}
PROMPTS = [[100 + 7 * i + j for j in range(6 + i)] for i in range(5)]


def _target_weights(path: Path) -> dict[str, torch.Tensor]:
    weights = load_file(path / "model.safetensors")
    weights.setdefault("lm_head.weight", weights["model.embed_tokens.weight"])  # tied
    return weights


# ---- Medusa ---------------------------------------------------------------------------------


def _medusa_tensors(target: Path, num_heads: int, num_layers: int, seed: int, like_target: bool):
    """Per head: its blocks' (weight, bias) and its vocabulary projection. `like_target`: the
    target's head plus noise (some drafts right); else all random."""
    g = torch.Generator().manual_seed(seed)
    lm_head = _target_weights(target)["lm_head.weight"]
    vocab, hidden = lm_head.shape
    heads = []
    for _ in range(num_heads):
        blocks = [
            (
                torch.randn(hidden, hidden, generator=g) * 0.05,
                torch.randn(hidden, generator=g) * 0.05,
            )
            for _ in range(num_layers)
        ]
        noise = torch.randn(vocab, hidden, generator=g)
        head = lm_head + 0.3 * noise if like_target else noise
        heads.append((blocks, head))
    return heads


def _save_medusa(directory: Path, heads, layout: str) -> Path:
    """Write heads in FasterDecoding's layout ("fd": safetensors, "fd-pt": torch.save) or
    vLLM's MedusaModel's ("vllm")."""
    directory.mkdir(parents=True, exist_ok=True)
    num_heads, num_layers = len(heads), len(heads[0][0])
    tensors = {}
    for k, (blocks, head) in enumerate(heads):
        for i, (w, b) in enumerate(blocks):
            if layout == "vllm":
                tensors[f"blocks.{k}.layers.{i}.weight"], tensors[f"blocks.{k}.layers.{i}.bias"] = (
                    w,
                    b,
                )
            else:
                tensors[f"{k}.{i}.linear.weight"], tensors[f"{k}.{i}.linear.bias"] = w, b
        name = f"lm_heads.{k}.weight" if layout == "vllm" else f"{k}.{num_layers}.weight"
        tensors[name] = head
    tensors = {n: t.contiguous() for n, t in tensors.items()}
    if layout == "vllm":
        config = dict(
            architectures=["MedusaModel"],
            num_heads=num_heads,
            num_hidden_layers=num_layers,
            medusa_fc_bias=True,
            hidden_size=heads[0][1].shape[1],
            vocab_size=heads[0][1].shape[0],
        )
        save_file(tensors, directory / "model.safetensors")
    else:
        config = dict(
            medusa_num_heads=num_heads, medusa_num_layers=num_layers, base_model_name_or_path="tiny"
        )
        if layout == "fd-pt":
            torch.save(tensors, directory / "medusa_lm_head.pt")
        else:
            save_file(tensors, directory / "medusa_lm_head.safetensors")
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _medusa_reference(heads, hidden: torch.Tensor) -> torch.Tensor:
    """Each head as published: x <- x + SiLU(W x + b) per block, then its projection."""
    out = []
    for blocks, head in heads:
        x = hidden.double()
        for w, b in blocks:
            z = x @ w.double().T + b.double()
            x = x + z * torch.sigmoid(z)
        out.append(x @ head.double().T)
    return torch.stack(out)


@pytest.mark.parametrize("layout", ["fd", "fd-pt", "vllm"])
def test_medusa_heads_match_the_reference(tiny_model_path, tmp_path, layout):
    heads = _medusa_tensors(tiny_model_path, num_heads=3, num_layers=2, seed=1, like_target=False)
    loaded = load_medusa(_save_medusa(tmp_path / layout, heads, layout), 64, 49152)
    hidden = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    got = loaded(hidden, range(3))
    torch.testing.assert_close(got.double(), _medusa_reference(heads, hidden), rtol=1e-4, atol=1e-4)
    # Heads are independent: a later range alone gives the same logits.
    torch.testing.assert_close(loaded(hidden, range(1, 3)), got[1:])


@pytest.fixture(scope="module")
def medusa_dir(tiny_model_path, tmp_path_factory):
    heads = _medusa_tensors(tiny_model_path, num_heads=4, num_layers=1, seed=3, like_target=True)
    return _save_medusa(tmp_path_factory.mktemp("medusa"), heads, "fd")


def _engine(path: Path, **config) -> Engine:
    fields = dict(device="cpu", dtype="float32", max_kv_tokens=4096)
    return Engine(model=str(path), **(fields | config))


@pytest.fixture(scope="module")
def plain(tiny_model_path):
    engine = _engine(tiny_model_path, spec_method="none")
    yield engine
    engine.shutdown()


def _counts(engine) -> tuple[int, int]:
    s = engine.stats()
    return s["spec_proposed_tokens"], s["spec_accepted_tokens"]


def _settled(engine) -> None:
    wait_idle(engine)
    assert_no_kv_leak(engine)
    s = engine.stats()
    assert s.get("draft_kv_slots_free") == s.get("draft_kv_slots_total"), s


def _assert_lossless(plain: Engine, spec: Engine) -> None:
    """Greedy alone and batched, a JSON-schema gen, and seeded sampling: spec's outputs are
    plain's, with drafts both accepted and rejected."""
    want = [o.token_ids for o in plain.generate(PROMPTS, PENALISED)]
    assert [spec.generate(p, PENALISED).token_ids for p in PROMPTS[:2]] == want[:2]
    assert [o.token_ids for o in spec.generate(PROMPTS, PENALISED)] == want
    proposed, accepted = _counts(spec)
    assert 0 < accepted < proposed
    schema = SamplingParams(
        temperature=0, max_tokens=48, json_schema=json.dumps(PERSON), frequency_penalty=0.3
    )
    prompts = ["Person:", "x", "Record 7"]
    assert [o.text for o in spec.generate(prompts, schema)] == [
        o.text for o in plain.generate(prompts, schema)
    ]
    assert _counts(spec)[0] > proposed
    seeded = SamplingParams(
        temperature=0.8, top_p=0.95, max_tokens=24, ignore_eos=True, seed=5, n=4
    )
    assert [o.token_ids for o in spec.generate(PROMPTS[0], seeded)] == [
        o.token_ids for o in plain.generate(PROMPTS[0], seeded)
    ]
    _settled(spec)


def test_medusa_speculates_losslessly(tiny_model_path, plain, medusa_dir):
    spec = _engine(
        tiny_model_path, spec_method="medusa", draft_model=str(medusa_dir), spec_draft_length=3
    )
    try:
        _assert_lossless(plain, spec)
    finally:
        spec.shutdown()


def test_medusa_adaptive_length_lossless(tiny_model_path, plain, medusa_dir):
    spec = _engine(tiny_model_path, spec_method="medusa", draft_model=str(medusa_dir))
    spec.worker.cost.token_cost = lambda base_tokens, extra_seconds=0.0: 0.02
    try:
        want = [o.token_ids for o in plain.generate(PROMPTS, PENALISED)]
        assert [o.token_ids for o in spec.generate(PROMPTS, PENALISED)] == want
        assert _counts(spec)[0] > 0
        _settled(spec)
    finally:
        spec.shutdown()


def test_bad_medusa_heads(tiny_model_path, tmp_path):
    good = _medusa_tensors(tiny_model_path, num_heads=2, num_layers=1, seed=4, like_target=False)
    narrow = [([(w[:32, :32], b[:32]) for w, b in blocks], head[:, :32]) for blocks, head in good]
    path = _save_medusa(tmp_path / "narrow", narrow, "fd")
    with pytest.raises(ValueError, match=r"'0\.0\.linear\.weight'.*\(32, 32\).*\(64, 64\)"):
        _engine(tiny_model_path, spec_method="medusa", draft_model=str(path))
    path = _save_medusa(tmp_path / "missing", good, "vllm")
    weights = load_file(path / "model.safetensors")
    del weights["lm_heads.1.weight"]
    save_file(weights, path / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing tensor 'lm_heads\.1\.weight'"):
        load_medusa(path, 64, 49152)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="medusa_lm_head.safetensors"):
        load_medusa(tmp_path / "empty", 64, 49152)
    with pytest.raises(ValueError, match="no config.json"):
        load_medusa(tmp_path, 64, 49152)
    with pytest.raises(ValueError, match="draft_model"):
        Engine(spec_method="medusa")


# ---- EAGLE-3 --------------------------------------------------------------------------------

EAGLE = dict(
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=512,
)
DRAFT_VOCAB = 4096


def _eagle_tensors(target: Path, seed: int, like_target: bool) -> dict[str, torch.Tensor]:
    """An EAGLE-3 checkpoint over the tiny target (3 aux layers, a draft vocabulary of
    DRAFT_VOCAB target ids in shuffled order). `like_target`: fc passes the last aux state
    on and the head is the target's (its rows shuffled as d2t says), so the draft's guess is
    the target's own next token one place late - the tiny model repeats itself, so that is
    right now and then; else all random."""
    g = torch.Generator().manual_seed(seed)
    target_w = _target_weights(target)
    h, inter, q, kv = 64, 96, 4 * 16, 2 * 16
    scale = 0.02 if like_target else 0.3

    def rand(*shape):
        return torch.randn(*shape, generator=g) * scale

    ids = torch.randperm(49152, generator=g)[:DRAFT_VOCAB]
    fc = rand(h, 3 * h)
    lm_head = rand(DRAFT_VOCAB, h) / scale
    if like_target:
        fc[:, 2 * h :] += torch.eye(h)
        lm_head = target_w["lm_head.weight"][ids] + 0.1 * lm_head
    w = {
        "fc.weight": fc,
        "midlayer.self_attn.q_proj.weight": rand(q, 2 * h),
        "midlayer.self_attn.k_proj.weight": rand(kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": rand(kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": rand(h, q),
        "midlayer.mlp.gate_proj.weight": rand(inter, h),
        "midlayer.mlp.up_proj.weight": rand(inter, h),
        "midlayer.mlp.down_proj.weight": rand(h, inter),
        "midlayer.hidden_norm.weight": 1 + rand(h),
        "midlayer.input_layernorm.weight": 1 + rand(h),
        "midlayer.post_attention_layernorm.weight": 1 + rand(h),
        "norm.weight": target_w["model.norm.weight"].clone() if like_target else 1 + rand(h),
        "lm_head.weight": lm_head,
        "d2t": ids - torch.arange(DRAFT_VOCAB),
        "t2d": torch.zeros(49152, dtype=torch.bool),
    }
    return {n: t.contiguous() for n, t in w.items()}


def _save_eagle(directory: Path, tensors: dict, **config) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, directory / "model.safetensors")
    fields = dict(
        architectures=["LlamaForCausalLMEagle3"],
        vocab_size=49152,
        draft_vocab_size=DRAFT_VOCAB,
        num_hidden_layers=1,
        **EAGLE,
    )
    (directory / "config.json").write_text(json.dumps(fields | config))
    return directory


def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight


def _eagle_reference(w: dict, embed: torch.Tensor, tokens: list[int], g: torch.Tensor):
    """The published draft layer over rows (token, g) at positions 0.. in plain torch:
    (logits over the draft vocabulary, outputs before the final norm)."""
    w = {n: t.double() for n, t in w.items() if t.is_floating_point()}
    g, n, d = g.double(), len(tokens), 16
    x = torch.cat(
        [
            _rms(embed.double()[tokens], w["midlayer.input_layernorm.weight"]),
            _rms(g, w["midlayer.hidden_norm.weight"]),
        ],
        -1,
    )
    q = (x @ w["midlayer.self_attn.q_proj.weight"].T).view(n, 4, d)
    k = (x @ w["midlayer.self_attn.k_proj.weight"].T).view(n, 2, d)
    v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(n, 2, d)
    inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = torch.arange(n, dtype=torch.float64)[:, None] * inv
    cos, sin = torch.cat([angle.cos()] * 2, -1)[:, None], torch.cat([angle.sin()] * 2, -1)[:, None]

    def rotate(t):
        half = torch.cat([-t[..., d // 2 :], t[..., : d // 2]], -1)
        return t * cos + half * sin

    q, k = rotate(q), rotate(k)
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / d**0.5
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, 4 * d)
    residual = g + attn @ w["midlayer.self_attn.o_proj.weight"].T
    h = _rms(residual, w["midlayer.post_attention_layernorm.weight"])
    gate, up = h @ w["midlayer.mlp.gate_proj.weight"].T, h @ w["midlayer.mlp.up_proj.weight"].T
    out = residual + (torch.nn.functional.silu(gate) * up) @ w["midlayer.mlp.down_proj.weight"].T
    return _rms(out, w["norm.weight"]) @ w["lm_head.weight"].T, out


@pytest.mark.parametrize("cpu_kernels", [True, False])
def test_eagle3_layer_matches_the_reference(tiny_model_path, tmp_path, cpu_kernels):
    from braid.runtime.executor.forward_batch import ForwardBatch
    from braid.runtime.kvcache.pool import KVPool
    from braid.runtime.loading.model_loader import load_model, load_model_config
    from braid.runtime.spec.heads.eagle3 import load_eagle3

    config = load_model_config(tiny_model_path)
    target = load_model(tiny_model_path, config, torch.float32, torch.device("cpu"), cpu_kernels)
    tensors = _eagle_tensors(tiny_model_path, seed=5, like_target=False)
    path = _save_eagle(
        tmp_path, tensors, eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 0, 1]}
    )
    head, layers = load_eagle3(path, target)
    assert layers == (1, 1, 2)  # SGLang's ids name layer outputs
    n = 9
    tokens = [300 + 11 * i for i in range(n)]
    aux = torch.randn(n, 3 * 64, generator=torch.Generator().manual_seed(6))
    g = aux @ tensors["fc.weight"].T
    want_logits, want_out = _eagle_reference(
        tensors, _target_weights(tiny_model_path)["model.embed_tokens.weight"], tokens, g
    )
    kv = KVPool(1, 64, 2, 16, torch.float32, "cpu")
    slots = kv.allocate(n)
    # All rows at once, then the last two again one by one (a draft's steps).
    fb = ForwardBatch.build([tokens], [slots], [list(range(n))])
    logits, out = head(fb, kv, head.fc(aux), target.ops)
    torch.testing.assert_close(logits.double(), want_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.double(), want_out, rtol=1e-4, atol=1e-4)
    for i in (n - 2, n - 1):
        fb = ForwardBatch.build([[tokens[i]]], [slots[: i + 1]])
        logits, out = head(fb, kv, g[i : i + 1].float(), target.ops)
        torch.testing.assert_close(logits[0].double(), want_logits[i], rtol=1e-4, atol=1e-4)
    ids = torch.arange(DRAFT_VOCAB)
    assert torch.equal(head.target_ids(ids), ids + tensors["d2t"])


def test_eagle3_aux_layers():
    from braid.runtime.spec.heads.eagle3 import aux_layers

    assert aux_layers({}, 32) == (2, 16, 29)  # SGLang's and vLLM's default
    assert aux_layers({"eagle_aux_hidden_state_layer_ids": [1, 5, 9]}, 32) == (1, 5, 9)
    assert aux_layers({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 5, 9]}}, 32) == (
        2,
        6,
        10,
    )
    with pytest.raises(ValueError, match=r"\[2, 1, -1\]"):
        aux_layers({}, 2)


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_forward_captures_the_residual_stream(tiny_model_path, quantization):
    """The captured streams are transformers' hidden_states (float), the layer-by-layer
    path's bit for bit (the one-call decoder of int8), and the logits do not change."""
    import transformers

    from braid.runtime.executor.forward_batch import ForwardBatch, HiddenCapture
    from braid.runtime.kvcache.pool import KVPool
    from braid.runtime.loading.model_loader import load_model, load_model_config

    config = load_model_config(tiny_model_path)
    kw = {} if quantization == "none" else {"quantization": quantization}
    model = load_model(tiny_model_path, config, torch.float32, torch.device("cpu"), **kw)
    assert (model.decoder is not None) == (quantization == "int8")
    ids = [500 + 3 * i for i in range(7)]
    layers = (1, 0, 2, 1)

    def run(capture, decoder):
        kv = KVPool(2, 32, 2, 16, torch.float32, "cpu")
        saved, model.decoder = model.decoder, decoder
        try:
            fb = ForwardBatch.build([ids], [kv.allocate(len(ids))], [list(range(len(ids)))])
            return model(fb, kv, capture=capture)
        finally:
            model.decoder = saved

    plain = run(None, model.decoder)
    cap = HiddenCapture(layers=layers, final=True)
    assert torch.equal(run(cap, model.decoder), plain)
    assert cap.aux.shape == (len(ids), len(layers) * 64) and cap.normed.shape == (7, 64)
    by_layer = HiddenCapture(layers=layers)
    run(by_layer, None)
    assert torch.equal(cap.aux, by_layer.aux)
    if quantization == "none":
        ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path)
        hf = ref(torch.tensor([ids]), output_hidden_states=True).hidden_states
        for c, j in enumerate(layers[:2]):
            torch.testing.assert_close(
                cap.aux[:, c * 64 : (c + 1) * 64], hf[j][0], rtol=1e-4, atol=1e-4
            )
        torch.testing.assert_close(cap.normed, hf[2][0], rtol=1e-4, atol=1e-4)  # normed last


@pytest.fixture(scope="module")
def eagle_dir(tiny_model_path, tmp_path_factory):
    tensors = _eagle_tensors(tiny_model_path, seed=7, like_target=True)
    # The tiny target has 2 layers: name the streams (vLLM's convention).
    return _save_eagle(
        tmp_path_factory.mktemp("eagle3"), tensors, eagle_aux_hidden_state_layer_ids=[0, 1, 2]
    )


def test_eagle3_speculates_losslessly(tiny_model_path, plain, eagle_dir):
    spec = _engine(
        tiny_model_path, spec_method="eagle3", draft_model=str(eagle_dir), spec_draft_length=3
    )
    try:
        _assert_lossless(plain, spec)
    finally:
        spec.shutdown()


def test_eagle3_lossless_under_preemption_and_cached_prefixes(tiny_model_path, plain, eagle_dir):
    """A pool far too small: preemption, eviction and prefix-cache hits mid-speculation
    (the draft's context restarts where the target computed states)."""
    shared = [900 + i for i in range(40)]
    prompts = [shared + [2000 + 37 * i + j for j in range(5 + i % 20)] for i in range(24)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, frequency_penalty=0.5)
    want = [o.token_ids for o in plain.generate(prompts, params)]
    spec = _engine(
        tiny_model_path,
        spec_method="eagle3",
        draft_model=str(eagle_dir),
        spec_draft_length=3,
        max_kv_tokens=400,
        chunk_size=16,
        max_batch_tokens=96,
        max_running_requests=16,
    )
    try:
        assert [o.token_ids for o in spec.generate(prompts, params)] == want
        stats = spec.stats()
        assert stats["preemptions"] > 0 and stats["spec_accepted_tokens"] > 0, stats
        _settled(spec)
    finally:
        spec.shutdown()


def test_bad_eagle3_heads(tiny_model_path, tmp_path):
    tensors = _eagle_tensors(tiny_model_path, seed=8, like_target=False)
    ids = dict(eagle_aux_hidden_state_layer_ids=[0, 1, 2])
    path = _save_eagle(tmp_path / "wide", tensors, target_hidden_size=128, **ids)
    with pytest.raises(ValueError, match="target_hidden_size 128"):
        _engine(tiny_model_path, spec_method="eagle3", draft_model=str(path))
    missing = {n: t for n, t in tensors.items() if n != "midlayer.hidden_norm.weight"}
    path = _save_eagle(tmp_path / "missing", missing, **ids)
    with pytest.raises(ValueError, match=r"missing tensor 'layers\.0\.hidden_norm\.weight'"):
        _engine(tiny_model_path, spec_method="eagle3", draft_model=str(path))
    path = _save_eagle(tmp_path / "vocab", tensors, **(ids | {"vocab_size": 1000}))
    with pytest.raises(ValueError, match="vocab_size 1000"):
        _engine(tiny_model_path, spec_method="eagle3", draft_model=str(path))
    path = _save_eagle(tmp_path / "default-layers", tensors)  # (2, 1, -1) for 2 layers
    with pytest.raises(ValueError, match="aux layers"):
        _engine(tiny_model_path, spec_method="eagle3", draft_model=str(path))
    with pytest.raises(ValueError, match="no config.json"):
        _engine(tiny_model_path, spec_method="eagle3", draft_model=str(tmp_path))
