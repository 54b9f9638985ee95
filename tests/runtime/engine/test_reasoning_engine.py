"""Reasoning requests on the engine, with scripted models of the real families' templates
(tests/reasoning_models.py): a model that thinks and then writes `{"answer":true}` gets
exactly that under a JSON schema, its thought apart; budgets land the end marker at the
exact position with a valid answer after it; speculative decoding and jump-forward give the
same output across the switch; harmony's analysis, final header and calls."""

from __future__ import annotations

import json

import jsonschema
import pytest
import reasoning_models
import transformers
from reasoning_models import QUESTION, prompt_ids, scripted_model

from braid.grammars.constraints import ToolCalls, ToolSchema
from braid.runtime import Engine, SamplingParams
from braid.runtime.text.reasoning import prompt_opening
from braid.runtime.text.thought_split import splitter

scripted_models = reasoning_models.scripted_models
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "boolean"}},
    "required": ["answer"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}


def engine_of(path, **config) -> Engine:
    return Engine(model=str(path), device="cpu", dtype="float32", max_kv_tokens=4096, **config)


def split(engine: Engine, prompt: list[int], text: str) -> dict:
    reader = splitter(
        engine.reasoning_format, prompt_opening(engine.reasoning_format, engine.tokenizer, prompt)
    )
    out: dict = {"reasoning": "", "text": "", "calls": []}
    for e in reader.feed(text) + reader.finish():
        if e[0] == "call":
            out["calls"].append(e[1:])
        else:
            out[e[0]] += e[1]
    return out


def greedy(**fields) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=64, reasoning=True, **fields)


@pytest.fixture(scope="module")
def qwen3(scripted_models):
    m = scripted_models("qwen3_thinking", also={" yes": ("</think>", 0.5)})
    engine = engine_of(m.path)
    yield m, engine
    engine.shutdown()


def test_the_formats_are_detected(qwen3, scripted_models):
    _, engine = qwen3
    fmt = engine.reasoning_format
    assert (fmt.kind, fmt.start, fmt.end, len(fmt.end_ids)) == ("think", "<think>", "</think>", 1)


@pytest.mark.parametrize("name", ["qwen3_thinking", "r1_thinking", "smollm3_thinking"])
def test_a_thought_then_the_models_own_answer_under_the_schema(scripted_models, name):
    m = scripted_models(name)
    engine = engine_of(m.path)
    try:
        free = engine.generate(m.prompt_ids, greedy())
        held = engine.generate(m.prompt_ids, greedy(json_schema=ANSWER))
        plain = engine.generate(m.prompt_ids, SamplingParams(temperature=0, max_tokens=64))
    finally:
        engine.shutdown()
    assert free.token_ids == plain.token_ids == m.output_ids
    assert held.text == free.text  # jump-forward may spell the forced JSON in other tokens
    parts = split(engine, m.prompt_ids, held.text)
    assert parts == {"reasoning": "I should say yes.", "text": '{"answer":true}', "calls": []}
    jsonschema.validate(json.loads(parts["text"]), ANSWER)
    thought_ids = m.output_ids.index(engine.tokenizer.convert_tokens_to_ids("</think>")) + 1
    assert held.meta["reasoning_tokens"] == thought_ids


def test_the_schema_from_the_first_token_is_what_reasoning_avoids(qwen3):
    m, engine = qwen3
    out = engine.generate(
        m.prompt_ids, SamplingParams(temperature=0, max_tokens=64, json_schema=ANSWER)
    )
    assert "<think>" not in out.text  # the model could not think: the grammar began at once


@pytest.mark.parametrize("budget", [0, 1, 3])
def test_a_hard_budget_lands_the_end_at_exactly_n_thought_tokens(qwen3, budget):
    m, engine = qwen3
    out = engine.generate(
        m.prompt_ids,
        greedy(json_schema=ANSWER, thinking_budget=budget, thinking_budget_mode="hard"),
    )
    tok = engine.tokenizer
    end = tok.convert_tokens_to_ids("</think>")
    ids = out.token_ids
    if budget == 0:  # no thought: the answer at once
        assert end not in ids and tok.convert_tokens_to_ids("<think>") not in ids
    else:
        assert ids.index(end) == 1 + budget  # <think>, N thought tokens, </think>
        assert out.meta["reasoning_tokens"] == budget + 2
    jsonschema.validate(json.loads(split(engine, m.prompt_ids, out.text)["text"]), ANSWER)


def test_a_soft_budget_closes_where_the_model_ranks_the_end_high(qwen3):
    m, engine = qwen3
    # " yes" is the 4th thought token and ranks "</think>" second after it: a soft budget of
    # 5 (from its 4th token on) closes there; a hard one writes its 5 tokens.
    soft = engine.generate(m.prompt_ids, greedy(json_schema=ANSWER, thinking_budget=5))
    hard = engine.generate(
        m.prompt_ids, greedy(json_schema=ANSWER, thinking_budget=5, thinking_budget_mode="hard")
    )
    assert split(engine, m.prompt_ids, soft.text)["reasoning"] == "I should say yes"
    assert split(engine, m.prompt_ids, hard.text)["reasoning"] == "I should say yes."
    for out in (soft, hard):
        jsonschema.validate(json.loads(split(engine, m.prompt_ids, out.text)["text"]), ANSWER)


@pytest.mark.parametrize("budget, mode", [(None, "hard"), (2, "hard"), (5, "soft")])
def test_speculation_and_jump_forward_cross_the_switch(scripted_models, budget, mode):
    m = scripted_models("qwen3_thinking", also={" yes": ("</think>", 0.5)})
    params = greedy(json_schema=ANSWER, thinking_budget=budget, thinking_budget_mode=mode)
    outs = []
    for config in ({"jump_forward": False}, {}, {"spec_method": "draft", "draft_model": "self"}):
        engine = engine_of(m.path, **config)
        try:
            outs.append(engine.generate(m.prompt_ids, params))
            accepted = engine.stats()["spec_accepted_tokens"]
        finally:
            engine.shutdown()
    assert accepted >= 3, accepted  # drafts ran (through the thought and answer)
    assert outs[0].text == outs[1].text == outs[2].text
    assert outs[0].meta["reasoning_tokens"] == outs[2].meta["reasoning_tokens"]
    jsonschema.validate(json.loads(split(engine, m.prompt_ids, outs[0].text)["text"]), ANSWER)


def test_a_call_after_a_thought(scripted_models):
    m = scripted_models("qwen3_tool_call")
    engine = engine_of(m.path)
    calls = ToolCalls((ToolSchema.of("weather", {"type": "object"}, "tools[0]"),))
    try:
        out = engine.generate(m.prompt_ids, greedy(tool_calls=calls))
    finally:
        engine.shutdown()
    parts = split(engine, m.prompt_ids, out.text)
    assert parts["reasoning"] == "Checking the forecast."
    assert parts["text"].startswith("<tool_call>")


@pytest.fixture(scope="module")
def harmony(tmp_path_factory):
    """A GPT-OSS-templated model that writes an analysis message, then (where the final
    header is forced after it) `{"answer":true}`: the runner-up after <|message|>."""
    path = tmp_path_factory.mktemp("gpt-oss-analysis")
    tok = transformers.AutoTokenizer.from_pretrained(
        reasoning_models.family_tokenizer("gpt_oss", reasoning_models.default_model_dir(), path)
    )
    prompt = prompt_ids(tok, QUESTION)
    script = '<|channel|>analysis<|message|>I should say yes.<|end|>{"answer":true}<|return|>'
    scripted_model(path, "gpt_oss", prompt, script, also={"<|message|>": ('{"', 0.5)})
    engine = engine_of(path)
    yield engine, prompt
    engine.shutdown()


def test_harmony_analysis_then_the_final_channel(harmony):
    engine, prompt = harmony
    assert engine.reasoning_format.kind == "harmony"
    out = engine.generate(prompt, greedy(json_schema=ANSWER))
    assert out.text == (
        "<|channel|>analysis<|message|>I should say yes.<|end|>"
        '<|start|>assistant<|channel|>final <|constrain|>json<|message|>{"answer":true}'
    )
    parts = split(engine, prompt, out.text)
    assert parts == {"reasoning": "I should say yes.", "text": '{"answer":true}', "calls": []}


def test_harmony_budget_and_call(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt-oss-call")
    tok = transformers.AutoTokenizer.from_pretrained(
        reasoning_models.family_tokenizer("gpt_oss", reasoning_models.default_model_dir(), path)
    )
    prompt = prompt_ids(tok, QUESTION)
    script = (
        "<|channel|>analysis<|message|>Checking the forecast<|end|> to=functions.weather"
        '{"city":"Paris"}<|call|>'
    )
    also = {"<|message|>": ('{"', 0.5), prompt[-1]: (" to", 0.5)}  # the prompt's "assistant"
    scripted_model(path, "gpt_oss", prompt, script, also=also)
    engine = engine_of(path)
    calls = ToolCalls((ToolSchema.of("weather", WEATHER, "tools[0]"),))
    try:
        out = engine.generate(prompt, greedy(tool_calls=calls))
        short = engine.generate(
            prompt, greedy(tool_calls=calls, thinking_budget=2, thinking_budget_mode="hard")
        )
    finally:
        engine.shutdown()
    parts = split(engine, prompt, out.text)
    assert parts["reasoning"] == "Checking the forecast"
    assert parts["calls"] == [("weather", '{"city":"Paris"}')]
    assert out.token_ids[-1] == tok.convert_tokens_to_ids("<|call|>")
    assert split(engine, prompt, short.text)["reasoning"] == "Checking"
    [(name, arguments)] = split(engine, prompt, short.text)["calls"]
    jsonschema.validate(json.loads(arguments), WEATHER)
