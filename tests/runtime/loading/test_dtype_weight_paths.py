"""Every activation dtype on every weight path: GGUF blocks (a tiny Q8_0 GGUF), int8 and int4
blocks packed at load, and floats (a tiny HF model). Each generates, through prefill and
decode steps, the greedy tokens of the same weights in float32, within its dtype's rounding.

(bfloat16 on GGUF blocks used to fail every request: the file's norms stayed float32, so the
float32-only decode stack took a bfloat16 KV pool.)"""

from __future__ import annotations

import pytest
import torch
import transformers
from family_models import tiny_model

from braid.runtime.config import DTYPES
from braid.runtime.loading.dtype import cpu_has_bf16_matmuls

# Weight path -> (the model it runs: "gguf" or "hf", EngineConfig.quantization asked for,
# what it resolves to). A GGUF's blocks are what `auto`, the default, runs.
WEIGHT_PATHS = {
    "gguf-blocks": ("gguf", "auto", "gguf"),
    "int8": ("hf", "int8", "int8"),
    "int4": ("hf", "int4", "int4"),
    "floats": ("hf", "none", "none"),
}
PROMPT = list(range(300, 318))
NEW_TOKENS = 8
# How far a token's logprob may be from float32's, which is scored over the whole sequence
# in one prefill: bfloat16 keeps 8 bits of mantissa, float16 11 (seen here: at most 0.06 and
# 0.03, on int4 blocks, whose kernels round their inputs to int8 too); float32's decode
# steps differ from its prefill in summation order alone.
TOLERANCE = {torch.float32: 1e-3, torch.float16: 0.1, torch.bfloat16: 0.2}


@pytest.fixture(autouse=True)
def _caches(tmp_path_factory, monkeypatch):
    """GGUF conversions and `auto`'s timings in a directory of the tests' own."""
    monkeypatch.setenv("BRAID_MODEL_CACHE", str(tmp_path_factory.getbasetemp() / "models"))
    monkeypatch.setenv("BRAID_CACHE", str(tmp_path_factory.getbasetemp() / "braid"))


@pytest.fixture(scope="module")
def models(tmp_path_factory, default_model_path, make_tiny_model) -> dict:
    """A tiny HF llama, and a tiny GGUF with Q8_0 blocks (SmolLM3: a Llama whose every fourth
    layer has no RoPE; the GGUF writer has no plain-Llama layout). Their heads are untied: a
    tied head repeats the last token, a weak check of the decode steps."""
    from conftest import TINY, hf_gguf

    out = tmp_path_factory.mktemp("dtype-paths")
    fields = TINY | dict(
        num_hidden_layers=4, no_rope_layer_interval=4, rope_theta=1000.0, tie_word_embeddings=False
    )

    def randomize(name: str, p: torch.nn.Parameter) -> None:
        if "norm" in name:  # norms of 1 would hide one left in the wrong dtype
            p.normal_(1.0, 0.3)

    hf = tiny_model(
        out / "smollm3", default_model_path, transformers.SmolLM3Config, fields, randomize
    )
    gguf = hf_gguf().write_hf_gguf(out / "smollm3-Q8_0.gguf", hf, "Q8_0")
    return {"gguf": gguf, "hf": make_tiny_model("llama3-rope")}


def start(weights: str, models: dict, dtype: str):
    from braid.runtime import Engine

    model, asked, resolved = WEIGHT_PATHS[weights]
    engine = Engine(
        model=str(models[model]), device="cpu", dtype=dtype, quantization=asked, max_kv_tokens=256
    )
    assert engine.config.quantization == resolved
    return engine


@pytest.fixture(scope="module")
def float32_engines(models):
    """Each weight path's float32 engine (started on first use), the reference of its dtypes."""
    engines = {}

    def engine(weights: str):
        if weights not in engines:
            engines[weights] = start(weights, models, "float32")
        return engines[weights]

    yield engine
    for engine in engines.values():
        engine.shutdown()


def float32_scores(engine, tokens: list[int]) -> tuple[list[float], list[float]]:
    """(the logprob of each of `tokens` after PROMPT and those before it, the top logprob
    there), from one float32 prefill of the whole sequence."""
    from braid.runtime import SamplingParams

    params = SamplingParams(max_tokens=0, prompt_logprobs_from=len(PROMPT), top_logprobs=1)
    meta = engine.generate(PROMPT + tokens, params).meta
    return meta["prompt_logprobs"], [max(top.values()) for top in meta["prompt_top_logprobs"]]


def expected_dtypes(dtype: str, quantization: str) -> set[torch.dtype]:
    if dtype != "auto":
        return {DTYPES[dtype]}
    if quantization != "none":  # the quantized kernels compute in float32
        return {torch.float32}
    # Floats: whichever this CPU runs faster (runtime/loading/dtype.py).
    return {torch.float32, torch.bfloat16} if cpu_has_bf16_matmuls() else {torch.float32}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "auto"])
@pytest.mark.parametrize("weights", list(WEIGHT_PATHS))
def test_every_dtype_generates_float32s_greedy_tokens_on_every_weight_path(
    models, float32_engines, weights, dtype
):
    from braid.runtime import SamplingParams

    engine = start(weights, models, dtype)
    try:
        assert engine.dtype in expected_dtypes(dtype, WEIGHT_PATHS[weights][2])
        # Everything the forward reads in floats is in the activations' dtype.
        assert engine.kv.dtype == engine.dtype
        assert engine.model.norm.weight.dtype == engine.dtype
        if engine.dtype != torch.float32:
            assert engine.model.decoder is None  # the decode stack runs float32 alone
        elif weights == "gguf-blocks":
            assert engine.model.decoder is not None  # as bfloat16's used to, and failed
        params = SamplingParams(
            temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=True
        )
        out = engine.generate(PROMPT, params)
    finally:
        engine.shutdown()
    assert len(out.token_ids) == NEW_TOKENS
    want, best = float32_scores(float32_engines(weights), out.token_ids)
    tolerance = TOLERANCE[engine.dtype]
    # Each step computed float32's distribution, within the rounding, and picked its top
    # token (or one as near it as the rounding reaches: these random models have near ties).
    assert out.meta["logprobs"] == pytest.approx(want, abs=tolerance)
    assert all(w >= b - 2 * tolerance for w, b in zip(want, best, strict=True)), (want, best)
