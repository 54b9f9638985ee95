"""Every example runs on the default model and gives results of the promised shape."""

from __future__ import annotations

import datetime
import importlib.util
import json
import re
import sys
from pathlib import Path

import jsonschema
import msgspec
import pytest

pytestmark = pytest.mark.model

EXAMPLES = Path(__file__).parents[2] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # msgspec resolves the module's annotations through it
    spec.loader.exec_module(module)
    return module


def test_quickstart(capsys):
    from braid.interpreter.backend import default_backend
    from braid.runtime import SamplingParams

    out = _load("quickstart").main()
    printed = capsys.readouterr().out
    assert out["sentiment"] == "negative"
    # The reference: the engine the example ran on (the default backend's), given each greedy
    # gen's chat as the tokenizer's template writes it, with the gen's own sampling.
    engine = default_backend().engine

    def reply(question: str) -> str:
        chat = engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        params = SamplingParams(temperature=0, max_tokens=40, stop="\n")
        return engine.generate(chat, params).text

    answer, streamed = reply("Name the capital of France."), reply("Name a primary color.")
    assert answer and streamed
    assert (out["answer"], out["streamed"]) == (answer, streamed)
    # The forks' ideas are sampled (temperature 0.8, a seed each) in one batch: this engine is
    # not batch-invariant (deterministic=False), so a run alone need not sample the same
    # tokens; they are checked for their shape, one line each, between the exact parts.
    head = f"Q: Name the capital of France.\nA: {answer}\nsentiment: negative\nIdeas:\n"
    tail = f"streaming: {streamed}\n"
    assert printed.startswith(head) and printed.endswith(tail), printed
    ideas = printed[len(head) : len(printed) - len(tail)].splitlines()
    assert len(ideas) == 3 and all(idea.startswith("- ") for idea in ideas), printed


def test_json_extraction():
    example = _load("json_extraction")
    contacts = example.main()
    assert len(contacts) == len(example.NOTES)
    schema = msgspec.json.schema(example.Contact)
    for contact in contacts:
        assert isinstance(contact, example.Contact)
        jsonschema.validate(json.loads(msgspec.json.encode(contact)), schema)


def test_regex_fields():
    values = _load("regex_fields").main()
    assert re.fullmatch(r"INV-[0-9]{4}-[0-9]{4}", values["invoice_id"])
    assert isinstance(values["issued"], datetime.date)
    assert isinstance(values["total"], float)
    assert values["currency"] in {"EUR", "USD", "GBP"}


def test_agent_branches():
    example = _load("agent_branches")
    results = example.main()
    assert [r["task"] for r in results] == example.TASKS
    for r in results:
        assert re.match(rf"I will use the ({'|'.join(example.TOOLS)}) tool\. Plan: ", r["chosen"])


def test_few_shot_eval():
    report = _load("few_shot_eval").main()
    assert 0.5 <= report["accuracy"] <= 1  # 15/24 with this model; chance is 1/3
    # 24 prompts of ~280 tokens: the shared few-shot part is computed once.
    assert report["computed_tokens"] < report["prompt_tokens"] / 4
