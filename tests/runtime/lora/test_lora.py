"""LoRA adapters: PEFT's files loaded onto our fused linears, checked against PEFT's merged
model; batches mixing adapters; the prefix cache kept apart per adapter; load and unload."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import msgspec
import pytest
import torch
import transformers
from conftest import LiveServer, assert_no_kv_leak, wait_for, wait_idle

from braid.runtime.engine.engine import Engine
from braid.runtime.executor.forward_batch import ForwardBatch
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.loading.model_loader import load_model, load_model_config
from braid.runtime.lora.adapter import LoraBatch, load_adapter
from braid.runtime.protocol.sampling_params import SamplingParams

peft = pytest.importorskip("peft")

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
GREEDY_8 = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
GREEDY_6 = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def make_adapter(base_path, out_dir, seed: int, targets=ALL, rank=4, alpha=8, **extra):
    """A random PEFT LoRA adapter for the model at base_path, saved under out_dir; returns
    (its directory, PEFT's merged model)."""
    torch.manual_seed(seed)
    base = transformers.AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, **extra)
    model = peft.get_peft_model(base, config)
    with torch.no_grad():  # B starts at zero (the adapter would change nothing)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    model.save_pretrained(out_dir)
    return out_dir, model.merge_and_unload().eval()


@pytest.fixture(scope="module")
def adapters(tiny_model_path, tmp_path_factory):
    """name -> (directory, merged reference model): all seven targets, rsLoRA, q/v only, and
    a fourth of another rank."""
    root = tmp_path_factory.mktemp("lora")
    specs = {
        "all": dict(seed=1),
        "rslora": dict(seed=2, use_rslora=True, rank=8, alpha=4),
        "qv": dict(seed=3, targets=["q_proj", "v_proj"]),
        "mlp": dict(seed=4, targets=["gate_proj", "down_proj"], rank=2),
    }
    return {
        name: make_adapter(tiny_model_path, root / name, **spec) for name, spec in specs.items()
    }


def reference_greedy(model, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=n, do_sample=False, min_new_tokens=n
        )
    return out[0, len(ids) :].tolist()


def prompt_ids(seed: int, n: int = 20) -> list[int]:
    return torch.randint(5, 1000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def base_model(tiny_model_path):
    config = load_model_config(tiny_model_path)
    model = load_model(tiny_model_path, config, torch.float32, torch.device("cpu"))
    kv = KVPool(config.num_layers, 1024, config.num_kv_heads, config.head_dim, torch.float32, "cpu")
    return config, model, kv


def forward(model, kv, seqs: list[list[int]], adapters) -> list[torch.Tensor]:
    """Each sequence's prefill logits [n, V], all in one batch under its adapter."""
    slots = [kv.allocate(len(s)) for s in seqs]
    try:
        lens = [len(s) for s in seqs]
        lora = LoraBatch.of(adapters, lens, torch.device("cpu"))
        batch = ForwardBatch.build(seqs, slots, [list(range(n)) for n in lens], lora=lora)
        return list(model(batch, kv).split(lens))
    finally:
        for s in slots:
            kv.free(s)


@pytest.mark.parametrize("name", ["all", "rslora", "qv", "mlp"])
def test_logits_equal_pefts_merged_model(base_model, adapters, name):
    config, model, kv = base_model
    path, merged = adapters[name]
    adapter = load_adapter(name, path, config, torch.float32, torch.device("cpu"))
    ids = prompt_ids(0)
    [ours] = forward(model, kv, [ids], [adapter])
    with torch.no_grad():
        ref = merged(torch.tensor([ids])).logits[0]
        base = forward(model, kv, [ids], [None])[0]
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)
    assert not torch.allclose(ours, base, atol=1e-2)  # the adapter does change the output


def test_a_batch_mixing_adapters_gives_each_row_its_own(base_model, adapters):
    config, model, kv = base_model
    loaded = [
        load_adapter(n, adapters[n][0], config, torch.float32, torch.device("cpu"))
        for n in adapters
    ]
    seqs = [prompt_ids(i, 10 + 3 * i) for i in range(6)]
    chosen = [*loaded, None, loaded[0]]
    together = forward(model, kv, seqs, chosen)
    for seq, adapter, got in zip(seqs, chosen, together, strict=True):
        [alone] = forward(model, kv, [seq], [adapter])
        torch.testing.assert_close(got, alone, atol=1e-5, rtol=0)
        if adapter is not None:
            assert not torch.allclose(got, forward(model, kv, [seq], [None])[0], atol=1e-2)


@pytest.fixture(scope="module")
def engine(tiny_model_path, adapters):
    paths = {name: str(path) for name, (path, _) in adapters.items()}
    e = Engine(
        model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=2048,
        lora_adapters=paths,
    )  # fmt: skip
    yield e
    e.shutdown()


@pytest.mark.parametrize("name", ["all", "rslora", "qv", None])
def test_engine_greedy_tokens_equal_pefts(engine, adapters, tiny_model_path, name):
    ids = prompt_ids(7)
    if name is None:
        ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    else:
        ref = adapters[name][1]
    out = engine.generate(ids, GREEDY, lora=name)
    assert out.token_ids == reference_greedy(ref, ids, GREEDY.max_tokens)
    assert_no_kv_leak(engine)


def test_concurrent_requests_of_four_adapters_and_the_base(engine):
    ids = prompt_ids(8)
    names = [*engine.adapters, None]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=True)

    def run(name, salt):
        out = engine.generate(ids, params, lora=name, cache_salt=salt)
        return out.token_ids, out.meta["logprobs"]

    alone = {n: run(n, "alone") for n in names}
    assert len({tuple(lp) for _, lp in alone.values()}) == len(names)  # each adapter differs
    with ThreadPoolExecutor(len(names) * 2) as pool:
        futures = {(n, i): pool.submit(run, n, f"c{i}") for n in names for i in range(2)}
    for (n, _), f in futures.items():
        tokens, logprobs = f.result()
        assert tokens == alone[n][0]
        assert logprobs == pytest.approx(alone[n][1], abs=1e-4)
    assert_no_kv_leak(engine)


def test_prefixes_are_cached_per_adapter(engine):
    ids, params = prompt_ids(9, 40), SamplingParams(max_tokens=2, temperature=0)
    first = engine.generate(ids, params, lora="all", cache_salt="p")
    assert first.meta["cached_tokens"] == 0
    assert engine.generate(ids, params, lora="all", cache_salt="p").meta["cached_tokens"] > 0
    # The same prompt under another adapter, or none, computes its prefix again ...
    other = engine.generate(ids, params, lora="qv", cache_salt="p")
    assert other.meta["cached_tokens"] == 0
    assert engine.generate(ids, params, cache_salt="p").meta["cached_tokens"] == 0
    # ... and gets its own adapter's tokens, not the first one's.
    alone = engine.generate(ids, params, lora="qv", cache_salt="fresh")
    assert other.token_ids == alone.token_ids
    assert engine.generate(ids, params, lora="qv", cache_salt="p").meta["cached_tokens"] > 0
    assert_no_kv_leak(engine)


def test_an_unknown_adapter_is_refused_naming_the_loaded_ones(engine):
    with pytest.raises(ValueError, match="unknown LoRA adapter 'nope'.*'all'"):
        engine.generate("hi", GREEDY, lora="nope")
    with pytest.raises(ValueError, match="unknown LoRA adapter"):
        engine.unload_lora("nope")


def test_load_and_unload(engine, adapters, tiny_model_path):
    ids = prompt_ids(10)
    before = engine.generate(ids, GREEDY, lora="qv").token_ids
    engine.load_lora("qv2", str(adapters["qv"][0]))
    with pytest.raises(ValueError, match="loaded already"):
        engine.load_lora("qv2", str(adapters["all"][0]))
    assert engine.generate(ids, GREEDY, lora="qv2").token_ids == before
    # In use by a queued or running request: refused.
    started, release = threading.Event(), threading.Event()

    def emit(chunk):
        started.set()
        release.wait()  # holds the engine thread while the request is live

    params = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
    rid = engine.submit(ids, params, emit, lora="qv2")
    started.wait()
    unloaded = ThreadPoolExecutor(1).submit(engine.unload_lora, "qv2")
    wait_for(lambda: engine._loop.num_queued, what="the unload to be queued")
    release.set()
    with pytest.raises(ValueError, match="in use"):
        unloaded.result()
    engine.abort(rid)
    # Loaded again under the same name with other weights: nothing cached under the old
    # one is matched.
    wait_idle(engine)
    engine.unload_lora("qv2")
    with pytest.raises(ValueError, match="unknown LoRA adapter 'qv2'"):
        engine.generate(ids, GREEDY, lora="qv2")
    engine.load_lora("qv2", str(adapters["all"][0]))
    out = engine.generate(ids, GREEDY, lora="qv2")
    assert out.meta["cached_tokens"] == 0
    assert out.token_ids == engine.generate(ids, GREEDY, lora="all").token_ids
    engine.unload_lora("qv2")
    assert_no_kv_leak(engine)


def test_quantized_base_with_float_updates(tiny_model_path, adapters):
    """int8 linears (the one-call decoder among them) plus float LoRA updates: close to
    PEFT's merged float model."""
    path, merged = adapters["all"]
    e = Engine(
        model=str(tiny_model_path), device="cpu", quantization="int8", max_kv_tokens=1024,
        lora_adapters={"all": str(path)},
    )  # fmt: skip
    try:
        assert e.model.decoder is not None or e.model.ops.name != "cpu-kernels"
        ids = prompt_ids(11)
        logprob_params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs_from=1)
        got = e.generate(ids, logprob_params, lora="all").meta["prompt_logprobs"]
        base = e.generate(ids, logprob_params).meta["prompt_logprobs"]
        with torch.no_grad():
            logp = torch.log_softmax(merged(torch.tensor([ids])).logits[0], -1)
        want = logp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
        # int8 rounding: the adapter's effect must dominate the difference
        assert (torch.tensor(got) - want).abs().mean() < 0.2 * (
            torch.tensor(base) - want
        ).abs().mean()
        # Decode steps under the adapter give, bit for bit, the logprobs a prefill of the
        # same tokens gives (batch invariance: docs/runtime.md).
        params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=True)
        out = e.generate(ids, params, lora="all")
        again = SamplingParams(max_tokens=1, prompt_logprobs_from=len(ids))
        prefilled = e.generate(ids + out.token_ids, again, lora="all").meta["prompt_logprobs"]
        assert out.meta["logprobs"] == prefilled
        assert_no_kv_leak(e)
    finally:
        e.shutdown()


def write_adapter(tmp_path, settings: dict, tensors: dict | None = None):
    (tmp_path / "adapter_config.json").write_text(json.dumps(settings))
    from safetensors.torch import save_file

    save_file(tensors or {"x": torch.zeros(1)}, tmp_path / "adapter_model.safetensors")
    return tmp_path


BASE_SETTINGS = dict(peft_type="LORA", r=4, lora_alpha=8, target_modules=["q_proj"], bias="none")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(use_dora=True), "use_dora"),
        (dict(bias="all"), "bias"),
        (dict(modules_to_save=["lm_head"]), "modules_to_save"),
        (dict(target_modules=["embed_tokens"]), "embed_tokens"),
        (dict(target_modules=["lm_head", "q_proj"]), "lm_head"),
        (dict(target_modules=".*proj"), "list of module names"),
        (dict(layers_to_transform=[0]), "layers_to_transform"),
        (dict(rank_pattern={"q_proj": 8}), "rank_pattern"),
        (dict(alpha_pattern={"q_proj": 8}), "alpha_pattern"),
        (dict(peft_type="IA3"), "only LORA"),
    ],
)
def test_unsupported_adapters_are_refused(tiny_model_path, tmp_path, change, message):
    config = load_model_config(tiny_model_path)
    path = write_adapter(tmp_path, BASE_SETTINGS | change)
    with pytest.raises(ValueError, match=message):
        load_adapter("x", path, config, torch.float32, torch.device("cpu"))


def test_an_adapter_of_another_shape_is_refused(tiny_model_path, adapters, tmp_path):
    config = load_model_config(tiny_model_path)
    prefix = "base_model.model.model.layers"
    tensors = {
        f"{prefix}.{i}.self_attn.q_proj.lora_{ab}.weight": torch.zeros(shape)
        for i in range(config.num_layers)
        for ab, shape in (("A", (4, 32)), ("B", (64, 4)))
    }
    path = write_adapter(tmp_path, BASE_SETTINGS, tensors)
    with pytest.raises(ValueError, match="base model needs"):
        load_adapter("x", path, config, torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="missing"):
        load_adapter("x", write_adapter(tmp_path, BASE_SETTINGS), config, torch.float32, "cpu")


def test_config_takes_name_equals_path():
    from braid.runtime.config import EngineConfig

    assert EngineConfig(lora=["a=/x"]).lora == ("a=/x",)
    for bad in (["a"], ["=x"], ["a=/x", "a=/y"]):
        with pytest.raises(ValueError, match="EngineConfig.lora"):
            EngineConfig(lora=bad)
    with pytest.raises(ValueError, match="tp > 1"):
        EngineConfig(lora=["a=/x"], tp=2)


@pytest.fixture(scope="module")
def server(engine):
    s = LiveServer(engine, lora_updates=True)
    yield s
    s.stop()


def test_the_server_lists_adapters_and_serves_them_by_model_name(engine, server):
    cards = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert [c["id"] for c in cards] == ["tiny", *engine.adapters]
    assert all(c["parent"] == "tiny" for c in cards[1:])
    ids = prompt_ids(12)
    body = dict(prompt=ids, max_tokens=8, temperature=0, ignore_eos=True)
    for model, lora in (("tiny", None), ("tiny:qv", "qv"), ("all", "all")):
        r = httpx.post(f"{server.url}/v1/completions", json=body | {"model": model}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == engine.generate(ids, GREEDY_8, lora=lora).text
    r = httpx.post(f"{server.url}/v1/completions", json=body | {"model": "tiny:nope"})
    assert r.status_code == 404


def test_generate_takes_lora_path(engine, server):
    ids = prompt_ids(13)
    body = dict(input_ids=ids, sampling_params=dict(max_new_tokens=8, temperature=0))
    body["sampling_params"]["ignore_eos"] = True
    r = httpx.post(f"{server.url}/generate", json=body | {"lora_path": "mlp"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["text"] == engine.generate(ids, GREEDY_8, lora="mlp").text
    r = httpx.post(f"{server.url}/generate", json=body | {"lora_path": "nope"}, timeout=60)
    assert r.status_code == 400 and "unknown LoRA adapter" in r.text


def test_adapters_load_and_unload_over_http(engine, server, adapters):
    url = server.url
    r = httpx.post(
        f"{url}/load_lora_adapter", json=dict(lora_name="h", lora_path=str(adapters["qv"][0]))
    )
    assert r.status_code == 200 and "h" in r.json()["loaded_adapters"], r.text
    bad = httpx.post(f"{url}/load_lora_adapter", json=dict(lora_name="x", lora_path="/nonexistent"))
    assert bad.status_code == 400
    r = httpx.post(f"{url}/unload_lora_adapter", json=dict(lora_name="h"))
    assert r.status_code == 200 and "h" not in r.json()["loaded_adapters"]
    assert "h" not in engine.adapters


def test_adapter_updates_need_the_flag(engine):
    s = LiveServer(engine)
    try:
        r = httpx.post(f"{s.url}/load_lora_adapter", json=dict(lora_name="h", lora_path="/x"))
        assert r.status_code == 404
    finally:
        s.stop()


def test_speculative_verification_runs_under_the_adapter(tiny_model_path, adapters):
    """n-gram drafts are verified in the same forward as the request's other tokens, under
    its adapter: the greedy tokens are PEFT's merged model's."""
    path, merged = adapters["all"]
    e = Engine(
        model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=1024,
        spec_method="ngram", lora_adapters={"all": str(path)},
    )  # fmt: skip
    try:
        ids = prompt_ids(14, 8) * 4  # repeats give the n-gram proposer drafts
        params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
        out = e.generate(ids, params, lora="all")
        assert out.token_ids == reference_greedy(merged, ids, 24)
        assert e.stats()["spec_proposed_tokens"] > 0  # drafts were verified
        assert_no_kv_leak(e)
    finally:
        e.shutdown()


def test_programs_run_under_an_adapter_locally_and_remotely(engine, server):
    from braid import gen, program, select
    from braid.interpreter import LocalBackend, RemoteBackend

    @program
    def story(s):
        s += "Once upon a time"
        s += gen("first", max_tokens=6, temperature=0, ignore_eos=True)
        s += gen("second", max_tokens=6, temperature=0, ignore_eos=True, lora="qv")
        s += select("pick", ["yes", "no", "maybe"])

    healed = msgspec.structs.replace(GREEDY_6, token_healing=True)  # as program gens run

    def expected(lora):
        first = engine.generate("Once upon a time", healed, lora=lora).text
        text = "Once upon a time" + first
        second = engine.generate(text, healed, lora="qv").text
        return first, second, text + second

    for backend in (LocalBackend(engine), RemoteBackend(server.url)):
        for lora in ("all", None):
            state = story.run(backend=backend, lora=lora)
            first, second, text = expected(lora)
            assert (state["first"], state["second"]) == (first, second)
            scores = asyncio.run(engine.ascore(text, ["yes", "no", "maybe"], lora=lora))
            got = state.meta("pick")["logprobs"]
            assert [lp for c in got for lp in c] == pytest.approx(
                [lp for c in scores for lp in c], abs=1e-4
            )
    base = asyncio.run(engine.ascore("Once upon a time", ["yes", "no"]))
    assert asyncio.run(engine.ascore("Once upon a time", ["yes", "no"], lora="all")) != base


@pytest.fixture(scope="module")
def bounded(tiny_model_path, adapters):
    """The four adapters with room for two of them in memory."""
    paths = {name: str(path) for name, (path, _) in adapters.items()}
    e = Engine(
        model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=2048,
        lora_adapters=paths, max_loaded_loras=2,
    )  # fmt: skip
    yield e
    e.shutdown()


def test_a_bound_on_adapters_in_memory_changes_no_output(engine, bounded):
    assert bounded.stats()["lora_adapters_loaded"] == 2 and len(bounded.adapters) == 4
    names = [*bounded.adapters] * 2
    reloads = bounded.stats()["lora_adapter_reloads"]
    for i, name in enumerate(names):  # one after another: each evicts the least recent
        ids = prompt_ids(20 + i)
        out = bounded.generate(ids, GREEDY, lora=name, cache_salt="rr")
        assert out.token_ids == engine.generate(ids, GREEDY, lora=name, cache_salt="rr").token_ids
        assert bounded.stats()["lora_adapters_loaded"] == 2
    assert bounded.stats()["lora_adapter_reloads"] - reloads == len(names)
    # All at once: every adapter in use is held (4 > 2 meanwhile), the rest go after.
    ids = prompt_ids(30)
    with ThreadPoolExecutor(len(names)) as pool:
        futures = {n: pool.submit(bounded.generate, ids, GREEDY, lora=n) for n in names}
    for name, f in futures.items():
        assert f.result().token_ids == engine.generate(ids, GREEDY, lora=name).token_ids
    wait_idle(bounded)
    assert bounded.stats()["lora_adapters_loaded"] == 2
    assert_no_kv_leak(bounded)


def test_an_adapter_in_use_is_not_evicted(engine, bounded):
    ids = prompt_ids(31)
    params = SamplingParams(max_tokens=300, temperature=0, ignore_eos=True)
    long = ThreadPoolExecutor(1).submit(bounded.generate, ids, params, lora="all")
    wait_for(lambda: bounded.stats()["running_requests"], what="the long request to run")
    for name in ("qv", "mlp", "rslora", "qv"):  # each would evict "all" were it idle
        bounded.generate(ids, GREEDY, lora=name)
    assert not long.done()
    assert long.result().token_ids == engine.generate(ids, params, lora="all").token_ids
    wait_idle(bounded)
    assert bounded.stats()["lora_adapters_loaded"] == 2
    assert_no_kv_leak(bounded)


def test_an_evicted_adapter_keeps_its_cached_prefixes(bounded):
    ids, params = prompt_ids(32, 40), SamplingParams(max_tokens=2, temperature=0)
    first = bounded.generate(ids, params, lora="qv", cache_salt="keep")
    for name in ("all", "mlp"):  # evict "qv"
        bounded.generate(ids, params, lora=name)
    reloads = bounded.stats()["lora_adapter_reloads"]
    again = bounded.generate(ids, params, lora="qv", cache_salt="keep")
    assert bounded.stats()["lora_adapter_reloads"] == reloads + 1
    assert again.meta["cached_tokens"] > 0 and again.token_ids == first.token_ids


def test_an_adapter_whose_files_went_fails_its_request_on_reload(bounded, adapters, tmp_path):
    import shutil

    from braid.runtime.config import EngineConfig

    with pytest.raises(ValueError, match="max_loaded_loras must be >= 1"):
        EngineConfig(max_loaded_loras=0)
    path = shutil.copytree(adapters["qv"][0], tmp_path / "gone")
    bounded.load_lora("gone", str(path))
    for name in ("all", "mlp"):  # evict "gone"
        bounded.generate(prompt_ids(33), GREEDY, lora=name)
    shutil.rmtree(path)
    with pytest.raises(ValueError, match="reloading LoRA adapter 'gone' failed"):
        bounded.generate(prompt_ids(33), GREEDY, lora="gone")
    bounded.unload_lora("gone")
    assert bounded.stats()["lora_adapters_loaded"] == 2
    assert_no_kv_leak(bounded)


def test_speculation_under_an_adapter_is_lossless(tiny_model_path, adapters):
    """int8 base, float32 updates (the C++ kernel, per row): n-gram speculation under an
    adapter gives plain decoding's tokens, greedy (with a penalty) and seeded."""
    path, _ = adapters["all"]
    engines = [
        Engine(
            model=str(tiny_model_path),
            device="cpu",
            quantization="int8",
            max_kv_tokens=2048,
            lora_adapters={"all": str(path)},
            spec_method=method,
            spec_draft_length=4,
        )  # fmt: skip
        for method in ("none", "ngram")
    ]
    try:
        prompts = [prompt_ids(s) * 2 for s in range(4)]  # repeats: drafts to verify
        penalised = SamplingParams(
            max_tokens=24, temperature=0, ignore_eos=True, frequency_penalty=0.5
        )
        seeded = SamplingParams(max_tokens=24, temperature=0.8, ignore_eos=True, seed=5)
        for params in (penalised, seeded):
            plain, spec = ([e.generate(p, params, lora="all") for p in prompts] for e in engines)
            assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
        assert engines[1].stats()["spec_accepted_tokens"] > 0
    finally:
        for e in engines:
            e.shutdown()
