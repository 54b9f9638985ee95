"""A request of max_tokens=0 that asks for top_logprobs gets the most likely tokens after its
prompt (meta "next_top_logprobs"), nothing sampled: checked against transformers' distribution
of the same model, with and without prompt logprobs."""

from __future__ import annotations

import pytest
import torch
import transformers

from braid.runtime import SamplingParams

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def reference(tiny_model_path, tiny_engine):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    ids = tiny_engine.encode(PROMPT)
    with torch.no_grad():
        return ids, model(torch.tensor([ids])).logits[0].log_softmax(-1)


@pytest.mark.parametrize("prompt_logprobs_from", [None, 1])
def test_top_tokens_after_the_prompt(tiny_engine, reference, prompt_logprobs_from):
    ids, logp = reference
    params = SamplingParams(max_tokens=0, top_logprobs=4, prompt_logprobs_from=prompt_logprobs_from)
    out = tiny_engine.generate(PROMPT, params)
    assert out.text == "" and out.token_ids == [] and out.meta["completion_tokens"] == 0
    assert out.meta["logprobs"] == out.meta["top_logprobs"] == []  # one per output token: none
    top = logp[-1].topk(4)
    next_top = out.meta["next_top_logprobs"]
    assert list(next_top) == top.indices.tolist()
    assert list(next_top.values()) == pytest.approx(top.values.tolist(), abs=1e-4)
    if prompt_logprobs_from is not None:  # the prompt's own logprobs are as before
        expected = [logp[i - 1, ids[i]].item() for i in range(1, len(ids))]
        assert out.meta["prompt_logprobs"] == pytest.approx(expected, abs=1e-4)


def test_none_without_top_logprobs(tiny_engine):
    out = tiny_engine.generate(PROMPT, SamplingParams(max_tokens=0, logprobs=True))
    assert "next_top_logprobs" not in out.meta and out.meta["completion_tokens"] == 0
