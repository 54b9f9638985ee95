"""EngineConfig.context_length on a longrope model (Phi-3-128k's kind): a context capped
within the original chooses the short factors, so short prompts match transformers (which
uses them while a sequence is within the original); uncapped, only sequences past the
original match. The attention scale stays the model's own either way."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers
from family_models import prompt_logits, random_ids, reference, reference_logits, tiny_model

from braid.runtime.engine.engine import Engine
from braid.runtime.kvcache.pool import KVPool
from braid.runtime.loading.model_loader import load_model, load_model_config
from braid.runtime.models.layers import rope
from braid.runtime.protocol.sampling_params import SamplingParams
from braid.runtime.server.http.limits import check_max_tokens
from braid.runtime.server.wire import BadRequest

ORIGINAL, MAX = 64, 256  # the model's own context is 4x its original: attention is scaled
PHI3 = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    rms_norm_eps=1e-6,
    max_position_embeddings=MAX,
    original_max_position_embeddings=ORIGINAL,
    rope_parameters={
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0, 1.0, 1.1, 1.2, 1.5, 2.0, 3.0, 4.0],
        "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0],
    },
    architectures=["Phi3ForCausalLM"],
)


def _random_norms(name: str, p: torch.nn.Parameter) -> None:
    if "norm" in name:
        p.normal_(1.0, 0.5)


@pytest.fixture(scope="module")
def phi3(tmp_path_factory, default_model_path):
    directory = tmp_path_factory.mktemp("tiny-phi3-128k")
    return tiny_model(directory, default_model_path, transformers.Phi3Config, PHI3, _random_norms)


@pytest.fixture(scope="module")
def capped(phi3):
    engine = Engine(str(phi3), device="cpu", dtype="float32", max_kv_tokens=512, context_length=64)
    yield engine
    engine.shutdown()


def _our_logits(path, ids: list[int], context_length: int | None) -> torch.Tensor:
    config = dataclasses.replace(load_model_config(path), context_length=context_length)
    model = load_model(path, config, torch.float32, torch.device("cpu"))
    kv = KVPool(config.num_layers, 512, config.num_kv_heads, config.head_dim, torch.float32, "cpu")
    return prompt_logits(model, kv, ids)


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.allclose(got, want, atol=1e-4, rtol=0)


def test_a_capped_context_gives_transformers_logits_within_the_original(phi3):
    config = load_model_config(phi3)
    short = random_ids(config, ORIGINAL - 24, seed=1)
    want = reference_logits(reference(phi3), short)
    assert _close(_our_logits(phi3, short, ORIGINAL), want)
    assert not _close(_our_logits(phi3, short, None), want)  # the long factors


def test_uncapped_matches_transformers_past_the_original(phi3):
    config = load_model_config(phi3)
    long = random_ids(config, ORIGINAL + 16, seed=2)
    assert _close(_our_logits(phi3, long, None), reference_logits(reference(phi3), long))


def test_the_cap_chooses_the_factors_and_keeps_the_models_scale():
    params = rope.rope_parameters(PHI3)
    full_freq, full_scale = rope.inv_freq(params, 16, MAX)
    short_freq, short_scale = rope.inv_freq(params, 16, MAX, ORIGINAL)
    base = rope.inv_freq({"rope_type": "default", "rope_theta": 10000.0}, 16, MAX)[0]
    assert torch.equal(short_freq, base / torch.tensor(PHI3["rope_parameters"]["short_factor"]))
    assert torch.equal(full_freq, base / torch.tensor(PHI3["rope_parameters"]["long_factor"]))
    assert short_scale == full_scale > 1.0  # sqrt(1 + ln 4 / ln 64), from the model's own 256


def test_the_cap_leaves_yarn_and_llama3_alone():
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    yarn["original_max_position_embeddings"] = ORIGINAL
    llama3 = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": ORIGINAL,
    }
    for params in (yarn, llama3, {"rope_type": "default", "rope_theta": 10000.0}):
        full, capped = rope.inv_freq(params, 16, MAX), rope.inv_freq(params, 16, MAX, 32)
        assert torch.equal(full[0], capped[0]) and full[1] == capped[1]


def test_a_capped_engine_decodes_as_transformers(phi3, capped):
    """Greedy tokens and their logprobs (the tokens alone barely move with the factors)."""
    assert capped.context_length == 64 and capped.model_config.max_position_embeddings == MAX
    ids = random_ids(capped.model_config, 20, seed=3)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=True)
    out = capped.generate(ids, params)
    with torch.no_grad():
        want = (
            reference(phi3)
            .generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None)[
                0, len(ids) :
            ]
            .tolist()
        )
    assert out.token_ids == want
    logits = reference_logits(reference(phi3), ids + want)[len(ids) - 1 : -1]
    want_logprobs = logits.log_softmax(-1).gather(1, torch.tensor(want)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(out.meta["logprobs"]), want_logprobs, atol=1e-4, rtol=0)


def test_a_capped_engine_holds_sequences_to_the_cap(capped):
    ids = random_ids(capped.model_config, 50, seed=4)
    with pytest.raises(ValueError, match="context is 64 tokens"):
        capped.generate(ids + ids[:14], SamplingParams(temperature=0, max_tokens=1))
    out = capped.generate(ids, SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    assert len(out.token_ids) == 14  # the output ends where the context does
    with pytest.raises(BadRequest, match="context is 64 tokens: at most 14"):
        check_max_tokens("max_tokens", 15, len(ids), capped.context_length)


def test_a_context_above_the_models_is_refused(phi3):
    with pytest.raises(ValueError, match=r"context_length 257 .* context of 256 tokens"):
        Engine(str(phi3), device="cpu", dtype="float32", context_length=MAX + 1)


def test_a_context_below_one_is_refused():
    from braid.runtime.config import EngineConfig

    with pytest.raises(ValueError, match="context_length must be >= 1"):
        EngineConfig(context_length=0)
