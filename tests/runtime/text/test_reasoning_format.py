"""A model's reasoning format, detected from its tokenizer and chat template, and where each
family's generation prompt leaves the model (runtime/text/reasoning.py), on tokenizers with
the real families' tokens and templates (tests/reasoning_models.py)."""

from __future__ import annotations

import pytest
import transformers
from reasoning_models import QUESTION, family_tokenizer, prompt_ids

from braid.runtime.text.reasoning import detect, prompt_opening


@pytest.fixture(scope="module")
def family(default_model_path, tmp_path_factory):
    def load(name: str):
        path = family_tokenizer(name, default_model_path, tmp_path_factory.mktemp(name))
        return transformers.AutoTokenizer.from_pretrained(path)

    return load


@pytest.mark.parametrize(
    "name, kind, special",
    [
        ("qwen3", "think", False),
        ("r1", "think", False),
        ("smollm3", "think", False),
        ("gpt_oss", "harmony", True),
    ],
)
def test_each_family_is_detected(family, name, kind, special):
    tok = family(name)
    fmt = detect(tok, tok.chat_template)
    assert (fmt.kind, fmt.special) == (kind, special)
    assert tok.decode(fmt.start_ids, skip_special_tokens=False) == fmt.start
    assert tok.decode(fmt.end_ids, skip_special_tokens=False) == fmt.end
    assert detect(tok, tok.chat_template, "none") is None


def test_a_model_that_does_not_think(tokenizer):
    assert detect(tokenizer, tokenizer.chat_template) is None
    forced = detect(tokenizer, tokenizer.chat_template, "think")  # the tags are text here
    assert forced.kind == "think" and len(forced.end_ids) > 1
    with pytest.raises(ValueError, match="lacks"):
        detect(tokenizer, tokenizer.chat_template, "harmony")
    with pytest.raises(ValueError, match="must be one of"):
        detect(tokenizer, tokenizer.chat_template, "deepseek")


@pytest.mark.parametrize(
    "name, kwargs, opening",
    [
        ("qwen3", {}, "maybe"),  # the model opens <think> itself
        ("qwen3", {"enable_thinking": False}, "off"),  # an empty closed block
        ("r1", {}, "thinking"),  # the prompt opens the block
        ("smollm3", {}, "maybe"),
        ("smollm3", {"enable_thinking": False}, "off"),
        ("gpt_oss", {}, "maybe"),  # <|start|>assistant: analysis or final next
    ],
)
def test_where_each_generation_prompt_leaves_the_model(family, name, kwargs, opening):
    tok = family(name)
    fmt = detect(tok, tok.chat_template)
    assert prompt_opening(fmt, tok, prompt_ids(tok, QUESTION, **kwargs)) == opening
