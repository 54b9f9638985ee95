"""A gen that writes an assistant reply on a model that thinks is a reasoning gen unless it
says otherwise (as the server's replies are), in braid's programs; SGLang's keep the raw
text; an opening that closes the thought (thinking=False) leaves the gen as it was
(scripted Qwen3 models: tests/reasoning_models.py)."""

from __future__ import annotations

import json

import jsonschema
import pytest
import reasoning_models
from reasoning_models import QUESTION

import braid as sgl
from braid import LocalBackend, assistant, gen, program, user
from braid.runtime import Engine

scripted_models = reasoning_models.scripted_models
SCHEMA = {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"]}


@pytest.fixture(scope="module")
def qwen3(scripted_models):
    path = scripted_models("qwen3_thinking").path  # <think>I should say yes.</think>{"answer":true}
    engine = Engine(model=str(path), device="cpu", dtype="float32", max_kv_tokens=4096)
    yield LocalBackend(engine)
    engine.shutdown()


@program
def ask(s, **gen_fields):
    s += user(QUESTION[0]["content"])
    s += assistant(gen("answer", max_tokens=40, **gen_fields))


def test_a_reply_thinks_apart_by_default(qwen3):
    state = ask.run(backend=qwen3, temperature=0, json_schema=SCHEMA)
    assert state["answer"] == '{"answer":true}'
    jsonschema.validate(json.loads(state["answer"]), SCHEMA)
    assert state["answer_reasoning_content"] == "I should say yes."
    free = ask.run(backend=qwen3, temperature=0)
    assert (free["answer"], free["answer_reasoning_content"]) == (
        '{"answer":true}',
        "I should say yes.",
    )


def test_reasoning_false_keeps_the_old_gen(qwen3):
    state = ask.run(backend=qwen3, temperature=0, reasoning=False)
    assert state["answer"] == '<think>I should say yes.</think>{"answer":true}'
    with pytest.raises(KeyError):
        state["answer_reasoning_content"]


def test_sglang_functions_keep_the_raw_text(qwen3):
    @sgl.function
    def raw(s):
        s += sgl.user(QUESTION[0]["content"])
        s += sgl.assistant(sgl.gen("answer", max_tokens=40))

    state = raw.run(backend=qwen3, temperature=0)
    assert state["answer"] == '<think>I should say yes.</think>{"answer":true}'
