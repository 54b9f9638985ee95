"""The engine on a GPU (Triton attention and sampling, CUDA graphs): greedy tokens equal
transformers' in float32, bfloat16 logprobs stay near float32's, constrained outputs obey
their constraint, and a shared prefix changes no token. Skipped without CUDA (the same paths
run on the CPU in triton's interpreter elsewhere); scripts/gpu_check.sh runs it on a GPU."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
import torch
from conftest import assert_no_kv_leak
from shared_cases import PERSON, PHONE, PROMPT, reference_greedy

from braid.runtime import Engine, SamplingParams

DEVICE = "cuda"
pytestmark = pytest.mark.skipif(
    DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU"
)
# bfloat16 keeps 8 bits of mantissa: the tiny model's logprobs (its head scaled by 8, so
# logits reach tens) move by about a hundredth through a forward in it.
BF16_LOGPROB_ATOL = 0.1


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def cuda_engine(request, tiny_model_path):
    engine = Engine(
        model=str(tiny_model_path), device=DEVICE, dtype=request.param, max_kv_tokens=4096
    )
    yield engine
    engine.shutdown()


def test_greedy_matches_transformers_in_float32(cuda_engine, tiny_model_path):
    if cuda_engine.dtype != torch.float32:
        pytest.skip("transformers' float32 tokens are the reference for float32 only")
    ids = cuda_engine.encode(PROMPT)
    # Batched with others, so the decode steps take the graphs of several rows.
    outs = cuda_engine.generate(
        [ids, ids[:3], ids + ids], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    )
    for prompt, out in zip([ids, ids[:3], ids + ids], outs, strict=True):
        assert out.token_ids == reference_greedy(tiny_model_path, prompt, 32)


def test_logprobs_are_near_transformers_float32(cuda_engine, reference_logprobs):
    """Prefill (prompt logprobs) and decode (sampled tokens' logprobs) in the engine's dtype
    against transformers in float32 over the same tokens."""
    ids = cuda_engine.encode(PROMPT * 3)
    params = SamplingParams(
        temperature=0, max_tokens=16, ignore_eos=True, logprobs=True, prompt_logprobs_from=1
    )
    out = cuda_engine.generate(ids, params)
    want = reference_logprobs(ids + out.token_ids, 1)
    got = [*out.meta["prompt_logprobs"], *out.meta["logprobs"]]
    atol = 1e-3 if cuda_engine.dtype == torch.float32 else BF16_LOGPROB_ATOL
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=atol, rtol=0)


def test_constrained_outputs_are_valid_every_time(cuda_engine):
    regex = [SamplingParams(max_tokens=64, temperature=1.0, regex=PHONE, seed=s) for s in range(8)]
    schema = [
        SamplingParams(max_tokens=120, temperature=1.0, json_schema=PERSON, seed=s)
        for s in range(8)
    ]
    # All sixteen in flight together: the sampling kernel applies each row's own mask.
    with ThreadPoolExecutor(len(regex) + len(schema)) as pool:
        outs = list(pool.map(lambda p: cuda_engine.generate("Contact:", p), regex + schema))
    for out in outs:
        assert out.finish_reason == "stop", out.text
    for out in outs[: len(regex)]:
        assert re.fullmatch(PHONE, out.text), out.text
    for out in outs[len(regex) :]:
        jsonschema.validate(json.loads(out.text), PERSON)
    assert_no_kv_leak(cuda_engine)


def test_a_shared_prefix_changes_no_token(cuda_engine):
    """A prompt computed cold, then again over its cached prefix, and as several requests
    sharing it at once: the same greedy tokens each time."""
    cuda_engine.flush_cache()
    ids = cuda_engine.encode(PROMPT * 8)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    cold = cuda_engine.generate(ids, params)
    warm = cuda_engine.generate(ids, params)
    assert warm.meta["cached_tokens"] > 0
    assert warm.token_ids == cold.token_ids
    together = cuda_engine.generate([ids] * 4, params)
    assert [o.token_ids for o in together] == [cold.token_ids] * 4
    assert_no_kv_leak(cuda_engine)
