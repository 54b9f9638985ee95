"""The DSL's reasoning keywords (gen's and select's `reasoning`, run's defaults, thinking
budgets) and what the interpreter does with a reasoning output, on a scripted backend that
answers as the Backend protocol says a reasoning one does (the split in its meta)."""

from __future__ import annotations

import pytest
from backend_doubles import ScriptedBase

import braid as sgl
from braid import assistant, gen, program, select, user
from braid.runtime.protocol import GenerateOutput
from braid.runtime.text.chat_template import ChatTemplate

ROLES = ChatTemplate(
    first_opening={"user": "<u>", "assistant": "<a>"},
    opening={"user": "<u>", "assistant": "<a>"},
    closing={"user": "</u>", "assistant": "</a>"},
)


class ThinkingBackend(ScriptedBase):
    """Writes "<think>{thought}</think>{answer}" for each reply, and records the params."""

    chat_template = ROLES
    reasoning_format = "think"  # the interpreter only asks whether there is one

    def __init__(self, *replies: tuple[str, str]) -> None:
        self.replies = list(replies)
        self.params = []

    async def generate(self, prompt, params, on_text, lora=None, program=None):
        self.params.append(params)
        thought, answer = self.replies.pop(0)
        text = f"<think>{thought}</think>{answer}"
        on_text(text)
        meta = {"reasoning_content": thought, "content": answer} if params.reasoning else {}
        return GenerateOutput(text, [], "stop", meta)


def test_reasoning_n_is_a_thinking_budget():
    assert gen("a", reasoning=5).sampling == {"reasoning": True, "thinking_budget": 5}
    assert gen("a", reasoning=True).sampling == {"reasoning": True}
    assert gen("a", reasoning=False).sampling == {"reasoning": False}
    hard = gen("a", reasoning=0, thinking_budget_mode="hard").sampling
    assert hard == {"reasoning": True, "thinking_budget": 0, "thinking_budget_mode": "hard"}
    with pytest.raises(TypeError, match="reasoning=5 is a thinking budget; so is"):
        gen("a", reasoning=5, thinking_budget=3)
    with pytest.raises(ValueError, match="thinking_budget needs reasoning=True"):
        gen("a", thinking_budget=3)
    with pytest.raises(ValueError, match="thinking_budget must be >= 0"):
        gen("a", reasoning=-1)


def test_a_select_after_a_thought_is_a_gen_under_its_choices():
    chosen = select("c", ["yes", "no"], reasoning=8)
    assert chosen.sampling == {"reasoning": True, "thinking_budget": 8, "choices": ["yes", "no"]}
    assert gen("c", choices=["yes", "no"], reasoning=True, max_tokens=9).sampling == {
        "max_tokens": 9,
        "choices": ["yes", "no"],
        "reasoning": True,
    }
    assert type(select("c", ["yes", "no"], reasoning=False)).__name__ == "Select"
    with pytest.raises(ValueError, match="written, not scored by a method"):
        select("c", ["yes", "no"], "greedy", reasoning=True)
    with pytest.raises(ValueError, match="written, not scored by a method"):
        gen("c", choices=["a", "b"], choices_method=sgl.greedy_token_selection, reasoning=True)
    with pytest.raises(ValueError, match="choices must be distinct"):
        gen("c", choices=["a", "a"], reasoning=True)


def test_run_takes_reasoning_as_every_gens_default():
    @program
    def two(s):
        s += gen("a") + gen("b", reasoning=False)

    backend = ThinkingBackend(("t", "x"), ("u", "y"))
    state = two.run(backend=backend, reasoning=16)
    first, second = backend.params
    assert (first.reasoning, first.thinking_budget) == (True, 16)
    assert (second.reasoning, second.thinking_budget) == (False, None)
    assert state["a"] == "x" and state["a_reasoning_content"] == "t"
    assert state["b"] == "<think>u</think>y" and "b_reasoning_content" not in state


def test_a_message_keeps_its_answers_and_gathers_its_thoughts():
    @program
    def p(s):
        s += user("q")
        s += assistant("A: " + gen("one", reasoning=True) + "; " + gen("two", reasoning=True))

    state = p.run(backend=ThinkingBackend(("first", "1"), ("second", "2")))
    assert state.text() == "<u>q</u><a>A: <think>first</think>1; <think>second</think>2</a>"
    assert state.messages()[1] == {
        "role": "assistant",
        "content": "A: 1; 2",
        "reasoning_content": "first\n\nsecond",
    }
    assert state.meta("one")["reasoning_content"] == "first"
    assert state.meta("one")["text"] == "<think>first</think>1"


def test_a_choice_cut_short_fails_braids_programs_and_stays_in_sglangs():
    def body(s):
        s += assistant(select("c", ["yes", "no"], reasoning=True))

    with pytest.raises(ValueError, match="cannot decode 'ye'"):
        program(body).run(backend=ThinkingBackend(("t", "ye")))
    state = sgl.function(body).run(backend=ThinkingBackend(("t", "ye")))
    assert state["c"] == "ye" and state["c_reasoning_content"] == "t"
