"""Speculation never changes the output, and a request's tokens never depend on what it is
batched with, wherever verification rows are computed as decode rows (the CPU kernels'
paths): the default model under KV pressure, GGUF blocks of each type, int8/int4, an MoE's
blocks, deterministic floats, constrained gens and seeded sampling.

Equality is exact: the same token ids, one request alone against the same request among
others, and plain decoding against `spec_method="auto"` (n-gram and suffix drafts)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
from conftest import random_gguf

from braid.runtime import Engine, SamplingParams
from braid.runtime.spec.lossless import unlike_decode_rows

STORY = "The fox ran through the forest, over the hills and far away. " * 4
SHARED = [
    f"Here is a story: {STORY}Question {i}: what is {i} plus {3 * i}? Answer:" for i in range(24)
]
COPY = [
    "Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "red green blue red green blue red green blue red green",
    "Once upon a time there was a king. Once upon a time there was a queen. Once upon a",
]
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=40, ignore_eos=True, seed=11)
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "tags": {"type": "array", "items": {"enum": ["fox", "dog", "king"]}, "maxItems": 4},
    },
    "required": ["name", "tags"],
}


def tokens(engine: Engine, prompts: list[str], params: SamplingParams, together: bool):
    if not together:
        return [engine.generate(p, params).token_ids for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: engine.generate(p, params).token_ids, prompts))


def test_the_default_model_alone_equals_crowded_under_kv_pressure():
    # A pool of a few requests' worth: the crowd shares its prefix, is chunked and preempted.
    engine = Engine(max_kv_tokens=1024, spec_method="none", chunk_size=64)
    try:
        alone = tokens(engine, SHARED, GREEDY, together=False)
        before = engine.stats()["preemptions"]
        crowded = tokens(engine, SHARED[::-1], GREEDY, together=True)[::-1]
        assert engine.stats()["preemptions"] > before  # the pressure happened
    finally:
        engine.shutdown()
    assert crowded == alone


def test_the_default_model_speculates_losslessly():
    plain = Engine(spec_method="none", max_kv_tokens=8192)
    auto = Engine(max_kv_tokens=8192)  # spec_method="auto", the default
    try:
        schema = SamplingParams(temperature=0, max_tokens=48, json_schema=json.dumps(PERSON))
        for params, together in ((GREEDY, False), (GREEDY, True), (SEEDED, True), (schema, False)):
            want = tokens(plain, COPY, params, together)
            assert tokens(auto, COPY, params, together) == want
        stats = auto.stats()
        assert 0 < stats["spec_accepted_tokens"] < stats["spec_proposed_tokens"]
        for out in auto.generate(COPY, schema):
            jsonschema.validate(json.loads(out.text), PERSON)
    finally:
        plain.shutdown()
        auto.shutdown()


@pytest.fixture(scope="module")
def gguf_of(tmp_path_factory):
    built = {}

    def make(block_type: str, shape: str = "tiny"):
        if (block_type, shape) not in built:
            path = tmp_path_factory.mktemp("gguf") / f"{shape}-{block_type}.gguf"
            built[block_type, shape] = random_gguf().write_random_gguf(
                path, shape, block_type, seed=3, vocab=1024
            )
        return built[block_type, shape]

    return make


def assert_speculation_lossless(model: str, **config) -> None:
    plain = Engine(model=model, spec_method="none", max_kv_tokens=4096, **config)
    spec = Engine(
        model=model, spec_method="ngram", spec_draft_length=4, max_kv_tokens=4096, **config
    )
    try:
        assert unlike_decode_rows(spec.runner.model) is None
        for params in (GREEDY, SEEDED):
            want = tokens(plain, COPY, params, together=True)
            assert tokens(spec, COPY, params, together=True) == want
            assert tokens(spec, COPY, params, together=False) == want
        assert spec.stats()["spec_accepted_tokens"] > 0
    finally:
        plain.shutdown()
        spec.shutdown()


# The default model covers Q4_1 and Q8_0; the others (suite time) run with the slow tests.
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "block_type",
    ["Q4_K_M", "Q6_K", "IQ4_NL", *(pytest.param(t, marks=SLOW) for t in ("Q4_0", "Q5_K_M"))],
)
def test_gguf_blocks_speculate_losslessly(gguf_of, block_type):
    assert_speculation_lossless(str(gguf_of(block_type)))


@pytest.mark.parametrize("quantization", ["int8", pytest.param("int4", marks=SLOW)])
def test_int8_and_int4_speculate_losslessly(tiny_model_path, quantization):
    assert_speculation_lossless(str(tiny_model_path), quantization=quantization)


def test_a_mixture_of_experts_speculates_losslessly(tmp_path):
    path = random_gguf().write_random_gguf(tmp_path / "moe.gguf", "tiny-moe", "Q8_0", vocab=1024)
    assert_speculation_lossless(str(path))


def test_deterministic_floats_speculate_losslessly(tiny_model_path):
    assert_speculation_lossless(str(tiny_model_path), deterministic=True, dtype="float32")


@SLOW  # suite time: the tiny model's tp tests in tests/runtime/tp run by default
def test_tensor_parallel_int8_speculates_losslessly(tiny_model_path):
    # Each rank's linears sum their rows alone, and the all-reduce adds the ranks' parts in
    # rank order whatever the batch.
    assert_speculation_lossless(str(tiny_model_path), quantization="int8", tp=2)
