"""Deterministic mode: a request's tokens and logprobs do not depend on what else is in the
batch (batch-invariant linears, attention row by row)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from braid.runtime import Engine, SamplingParams

PROMPTS = [
    "Once upon a time",
    "The quick brown fox jumps over the lazy dog and then " * 6,  # a long prompt: chunked
    "Hello",
    "In a galaxy far away, there was",
]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=True)
SAMPLED = SamplingParams(temperature=0.9, max_tokens=16, seed=7, ignore_eos=True, logprobs=True)


def run(engine: Engine, prompts: list[str], params: SamplingParams, threads: int = 1):
    """Each prompt's (tokens, logprobs): alone one after another, or all submitted at once."""
    with ThreadPoolExecutor(threads) as pool:
        outs = list(pool.map(lambda p: engine.generate(p, params), prompts))
    return [(o.token_ids, o.meta["logprobs"]) for o in outs]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_outputs_do_not_depend_on_the_batch(tiny_model_path, dtype):
    # Small chunks and step budgets make prefill chunking and batch shapes vary with the
    # company a request keeps; no prefix cache, so each run computes everything itself.
    engine = Engine(
        model=str(tiny_model_path), device="cpu", dtype=dtype, max_kv_tokens=4096,
        deterministic=True, chunk_size=16, max_batch_tokens=40, prefix_cache=False,
    )  # fmt: skip
    try:
        for params in (GREEDY, SAMPLED):
            alone = run(engine, PROMPTS, params)
            # All at once, in reverse, with as many others again.
            crowd = PROMPTS[::-1] + [p + " again" for p in PROMPTS]
            crowded = run(engine, crowd, params, threads=len(crowd))
            assert crowded[: len(PROMPTS)][::-1] == alone
    finally:
        engine.shutdown()


def test_deterministic_mode_refuses_what_it_cannot_keep():
    with pytest.raises(ValueError, match="LoRA adapters run neither"):
        Engine(deterministic=True, lora=("a=/nowhere",))
