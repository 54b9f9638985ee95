"""The embedded default model (SmolLM2-135M-Instruct) against transformers reading the same GGUF."""

from __future__ import annotations

import pytest
import torch
import transformers

from braid.runtime import Engine, SamplingParams
from braid.runtime.loading.default_model import find_gguf

pytestmark = pytest.mark.model

RAW_PROMPTS = [
    "The history of the Roman Empire begins",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
]
CHAT_PROMPTS = [
    "Write a short poem about the sea.",
    "Explain in a few sentences how a bicycle works.",
]
NEW_TOKENS = 48


@pytest.fixture(scope="module")
def engine():
    # quantization="none": the GGUF dequantized, as transformers reads it.
    engine = Engine(device="cpu", dtype="float32", max_kv_tokens=2048, quantization="none")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def reference():
    """transformers' own GGUF reader and dequantizer: independent of our conversion."""
    gguf = find_gguf()
    return transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    ).eval()


def prompts(engine):
    chats = [
        engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": p}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for p in CHAT_PROMPTS
    ]
    return [engine.encode(p) for p in RAW_PROMPTS] + chats


def prompt_logits(engine, ids: list[int]) -> torch.Tensor:
    """The engine's model's logits at every position of `ids`, one prefill."""
    from braid.runtime.executor.forward_batch import ForwardBatch

    slots = engine.kv.allocate(len(ids))
    try:
        batch = ForwardBatch.build([ids], [slots], logits_rows=[list(range(len(ids)))])
        return engine.model(batch, engine.kv)
    finally:
        engine.kv.free(slots)


def test_logits_match_transformers_reference(engine):
    """Every run: the logits transformers' GGUF reader gave over the default model (kept by
    scripts/llama_cpp_refs.py beside llama.cpp's, tests/data/llama_cpp/default.json)."""
    import json
    from pathlib import Path

    ref = json.loads((Path(__file__).parents[2] / "data/llama_cpp/default.json").read_text())
    ours = prompt_logits(engine, ref["prompt"])
    for pos, (kept, want) in enumerate(zip(ref["ids"], ref["transformers"], strict=True)):
        torch.testing.assert_close(ours[pos, kept], torch.tensor(want), atol=1e-3, rtol=1e-4)


# Suite time (transformers' GGUF reader takes a minute to load): the test above holds the
# default model to transformers' logits every run.
@pytest.mark.slow
def test_logits_match_transformers(engine, reference):
    ids = prompts(engine)[2]
    ours = prompt_logits(engine, ids)
    with torch.no_grad():
        ref = reference(torch.tensor([ids])).logits[0].float()
    torch.testing.assert_close(ours, ref, atol=1e-3, rtol=1e-4)


@pytest.mark.slow
def test_greedy_matches_transformers_generate(engine, reference):
    for ids in prompts(engine):
        ours = engine.generate(ids, SamplingParams(temperature=0, max_tokens=NEW_TOKENS))
        with torch.no_grad():
            ref = reference.generate(
                torch.tensor([ids]),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            )[0, len(ids) :].tolist()
        assert ours.token_ids == ref, engine.tokenizer.decode(ours.token_ids)
    assert len(ours.token_ids) >= 40


def test_chat_answer_is_sensible(engine):
    ids = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    out = engine.generate(ids, SamplingParams(temperature=0, max_tokens=30))
    assert "Paris" in out.text
    assert out.finish_reason == "stop"  # ends with <|im_end|>
