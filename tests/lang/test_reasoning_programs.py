"""Reasoning gens in programs, on LocalBackends over the scripted models of
tests/reasoning_models.py (Qwen3's template, where the model opens its thought, and
DeepSeek-R1's, whose prompt opens it): the thought, then the answer under the gen's own
constraint, in one request; the answer is the model's own, the thought goes to
`<name>_reasoning_content`, the messages and the meta, and the text keeps both."""

from __future__ import annotations

import json

import jsonschema
import msgspec
import pytest
import reasoning_models
import torch
import transformers
from reasoning_models import QUESTION, SCRIPTS, family_tokenizer, prompt_ids, scripted_model

import braid as sgl
from braid import LocalBackend, assistant, gen, program, select, user
from braid.runtime import Engine
from braid.runtime.loading.default_model import default_model_dir

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "boolean"}},
    "required": ["answer"],
    "additionalProperties": False,
}
THOUGHT = "I should say yes."
ANSWER = '{"answer":true}'  # compact: a JSON schema's grammar writes no whitespace (yet)
# Backends on reasoning_models.SCRIPTS's models, by the name their tests use here.
SCRIPTED = {"qwen3": "qwen3_thinking", "qwen3_off": "qwen3_no_thinking", "r1": "r1_thinking"}
SCRIPTED |= {"gpt_oss": "gpt_oss_analysis"}
CHOICE_SCRIPT = f"<think>{THOUGHT}</think>yes"  # Qwen3's, choosing after its thought

scripted_models = reasoning_models.scripted_models


class Verdict(msgspec.Struct):
    answer: bool


@pytest.fixture(scope="module")
def scripted(scripted_models, tmp_path_factory):
    """name -> a LocalBackend on SCRIPTED[name]'s model, or ("qwen3_choice") on a Qwen3
    model that writes CHOICE_SCRIPT."""
    made: dict[str, LocalBackend] = {}

    def make(name: str) -> LocalBackend:
        if name not in made:
            if name == "qwen3_choice":
                path = tmp_path_factory.mktemp(name)
                tokenizer = transformers.AutoTokenizer.from_pretrained(
                    family_tokenizer("qwen3", default_model_dir(), path)
                )
                scripted_model(path, "qwen3", prompt_ids(tokenizer, QUESTION), CHOICE_SCRIPT)
            else:
                path = scripted_models(SCRIPTED[name]).path
            engine = Engine(model=str(path), device="cpu", dtype="float32", max_kv_tokens=4096)
            made[name] = LocalBackend(engine)
        return made[name]

    yield make
    for backend in made.values():
        backend.engine.shutdown()


@program
def verdict(s, options):
    s += user(QUESTION[0]["content"])
    s += assistant(gen("answer", max_tokens=40, **options))


def _greedy(backend: LocalBackend, prompt: str) -> str:
    """What transformers' greedy decoding writes after `prompt` on the backend's model, up to
    its EOS (the reference the constrained output is held to)."""
    path = backend.engine.config.model
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    ids = backend.engine.encode(prompt)
    out = model.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False)
    written = out[0, len(ids) :].tolist()
    eos = model.generation_config.eos_token_id
    return backend.engine.tokenizer.decode(
        written[: written.index(eos)] if eos in written else written
    )


@pytest.mark.parametrize("name", ["qwen3", "r1"])
def test_a_schema_answer_after_a_thought_is_the_models_own(scripted, name):
    backend = scripted(name)
    options = {"json_schema": SCHEMA, "reasoning": True}
    state = verdict.run(options, backend=backend, temperature=0)
    meta = state.meta("answer")
    assert state["answer"] == ANSWER
    jsonschema.validate(json.loads(state["answer"]), SCHEMA)
    assert state["answer_reasoning_content"] == meta["reasoning_content"] == THOUGHT
    # The text keeps the output as the model wrote it, thought included: what transformers'
    # greedy decoding writes after the same prompt.
    prompt = state.text()[: state.text().rindex(meta["text"])]
    assert meta["text"] == _greedy(backend, prompt) == SCRIPTS[SCRIPTED[name]].text
    assert state.text() == prompt + meta["text"] + backend.chat_template.end("assistant")
    # Its tokens before the answer are the thought's, with its markers.
    before_answer = meta["text"][: meta["text"].rindex(ANSWER)]
    assert meta["reasoning_tokens"] == len(backend.engine.encode(prompt + before_answer)) - len(
        backend.engine.encode(prompt)
    )


def test_a_typed_answer_is_decoded_after_the_thought(scripted):
    options = {"json_schema": Verdict, "reasoning": True}
    state = verdict.run(options, backend=scripted("qwen3"), temperature=0)
    assert state["answer"] == Verdict(answer=True)
    assert state["answer_reasoning_content"] == THOUGHT


@pytest.mark.parametrize("mode", ["hard", "soft"])
@pytest.mark.parametrize("budget", [0, 2, 3])
def test_a_budget_bounds_the_thought_and_the_answer_stays_valid(scripted, mode, budget):
    backend = scripted("qwen3")
    options = {"json_schema": SCHEMA, "reasoning": budget, "thinking_budget_mode": mode}
    state = verdict.run(options, backend=backend, temperature=0)
    thought = state["answer_reasoning_content"]
    assert len(backend.engine.tokenizer.encode(thought, add_special_tokens=False)) <= budget
    assert THOUGHT.startswith(thought)  # the model's own thought, cut where the budget ends it
    jsonschema.validate(json.loads(state["answer"]), SCHEMA)
    if budget:
        assert state["answer"] == ANSWER  # after the forced end marker the model goes on


def test_thinking_off_answers_at_once_with_the_models_own_answer(scripted):
    @program
    def direct(s):
        s += user(QUESTION[0]["content"])
        s += assistant(gen("answer", json_schema=SCHEMA, reasoning=True), thinking=False)

    state = direct.run(backend=scripted("qwen3_off"), temperature=0, max_tokens=40)
    assert state["answer"] == ANSWER and state["answer_reasoning_content"] == ""
    assert state.meta("answer")["text"] == ANSWER
    assert state.messages()[1] == {"role": "assistant", "content": ANSWER}


def test_harmony_thinks_in_analysis_and_answers_in_final(scripted):
    backend = scripted("gpt_oss")
    state = verdict.run({"json_schema": SCHEMA, "reasoning": True}, backend=backend, temperature=0)
    assert state["answer_reasoning_content"] == THOUGHT  # its analysis message
    jsonschema.validate(json.loads(state["answer"]), SCHEMA)
    # The text keeps the channels as written: the analysis message, then the final header the
    # schema's answer is forced under (the model's script holds the analysis alone).
    final = "<|start|>assistant<|channel|>final <|constrain|>json<|message|>"
    written = f"<|channel|>analysis<|message|>{THOUGHT}<|end|>{final}{state['answer']}"
    assert state.meta("answer")["text"] == written
    assert state.text().endswith("<|start|>assistant" + written + "<|return|>")


def test_separate_reasoning_makes_its_gens_reasoning_ones(scripted):
    @sgl.function
    def separated(s):
        s += sgl.user(QUESTION[0]["content"])
        s += sgl.assistant(
            sgl.separate_reasoning(sgl.gen("answer", max_tokens=40), model_type="qwen3")
        )

    state = separated.run(backend=scripted("qwen3"), temperature=0)
    assert state["answer"] == ANSWER  # a free answer: the model's own after its thought
    assert state["answer_reasoning_content"] == THOUGHT


def test_separate_reasoning_reaches_into_parts_and_roles():
    inner = sgl.gen("x", max_tokens=8)
    parts = sgl.separate_reasoning("Answer: " + inner + sgl.select("y", ["a", "b"]))
    text, x, y = parts.items
    assert text == "Answer: " and x.sampling == {"max_tokens": 8, "reasoning": True}
    assert y.sampling["choices"] == ["a", "b"] and y.sampling["reasoning"] is True
    role = sgl.separate_reasoning(sgl.assistant(inner, thinking=True))
    assert role.role == "assistant" and role.thinking is True
    assert role.parts[0].sampling["reasoning"] is True
    assert inner.sampling == {"max_tokens": 8}  # the gen given is left as it was
    with pytest.raises(TypeError, match="a gen, a select"):
        sgl.separate_reasoning(3)


def test_a_select_after_a_thought_writes_the_models_choice(scripted):
    @program
    def pick(s):
        s += user(QUESTION[0]["content"])
        s += assistant(select("yn", ["yes", "no"], reasoning=True))

    state = pick.run(backend=scripted("qwen3_choice"), temperature=0, max_tokens=40)
    assert state["yn"] == "yes" and state["yn_reasoning_content"] == THOUGHT
    assert state.meta("yn")["text"] == CHOICE_SCRIPT
    # On the JSON-writing model the choice is still one of them, after its thought.
    state = pick.run(backend=scripted("qwen3"), temperature=0, max_tokens=40)
    assert state["yn"] in ("yes", "no") and state["yn_reasoning_content"] == THOUGHT


def test_gen_with_choices_after_a_thought(scripted):
    @program
    def pick(s):
        s += user(QUESTION[0]["content"])
        s += assistant(gen("yn", choices=["yes", "no"], reasoning=True, max_tokens=40))

    state = pick.run(backend=scripted("qwen3_choice"), temperature=0)
    assert state["yn"] == "yes" and state["yn_reasoning_content"] == THOUGHT


def test_messages_carry_the_reasoning_and_the_next_gen_continues_the_text(scripted):
    backend = scripted("qwen3")

    @program
    def two_turns(s):
        s += user(QUESTION[0]["content"])
        s += assistant(gen("answer", json_schema=SCHEMA, reasoning=True, max_tokens=40))
        s += user("Sure?")
        s += assistant(gen("again", max_tokens=4, reasoning=False))

    state = two_turns.run(backend=backend, temperature=0)
    messages = state.messages()
    assert messages[:3] == [
        QUESTION[0],
        {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT},
        {"role": "user", "content": "Sure?"},
    ]
    assert "reasoning_content" not in messages[3]
    # The second gen's prompt holds the first one's output as written, thought included, so
    # the engine's cache serves it past the first prompt.
    first, again = state.meta("answer"), state.meta("again")
    assert f"<think>{THOUGHT}</think>{ANSWER}" in state.text()
    assert again["cached_tokens"] > first["prompt_tokens"]


def test_the_model_without_a_reasoning_format_raises(tiny_model_path):
    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=4096)
    try:

        @program
        def thinks(s):
            s += "Q: Why?\nA:" + gen("answer", max_tokens=4, reasoning=True)

        with pytest.raises(
            ValueError,
            match=r"gen\('answer'\): reasoning needs a model that "
            r"thinks, and the model of this LocalBackend has no reasoning format",
        ):
            thinks.run(backend=LocalBackend(engine))
    finally:
        engine.shutdown()
