"""The trace of a reasoning gen marks its thought: the tokens before the answer (the thought
and its markers, as many as the engine's reasoning_tokens) are shown as thinking in the
page, the answer's are not, and the gen's line counts them."""

from __future__ import annotations

import pytest
import reasoning_models
from browser import browser_page
from reasoning_models import QUESTION

from braid import LocalBackend, assistant, gen, program, user
from braid.runtime import Engine

THOUGHT, ANSWER = "<think>I should say yes.</think>", '{"answer":true}'
SCHEMA = {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"]}


scripted_models = reasoning_models.scripted_models


@pytest.fixture(scope="module")
def backend(scripted_models):
    model = scripted_models("qwen3_thinking")  # writes THOUGHT + ANSWER
    assert reasoning_models.SCRIPTS["qwen3_thinking"].text == THOUGHT + ANSWER
    engine = Engine(model=str(model.path), device="cpu", dtype="float32", max_kv_tokens=4096)
    yield LocalBackend(engine)
    engine.shutdown()


@program
def thinks(s):
    s += user(QUESTION[0]["content"])
    s += assistant(gen("answer", json_schema=SCHEMA, reasoning=True, max_tokens=40))
    s += user("Sure?")
    s += assistant(gen("plain", max_tokens=3, reasoning=False))


def test_the_page_marks_the_thought_of_a_reasoning_gen(backend, tmp_path):
    state = thinks.run(backend=backend, temperature=0, trace=True)
    meta = state.meta("answer")
    trace = state.trace()
    path = tmp_path / "trace.html"
    trace.to_html(path)
    gens = [e for e in trace.states[0]["events"] if e["kind"] == "gen"]
    assert [e["reasoning_tokens"] for e in gens] == [meta["reasoning_tokens"], None]
    with browser_page() as page:
        page.goto(path.as_uri())
        spans = page.locator('#state-0 > .text span.tok[data-gen="answer"]')
        marked = spans.evaluate_all(
            "els => els.map(e => [e.classList.contains('thinking'), e.textContent])"
        )
        assert len(marked) == len(meta["token_ids"])
        thinking = [text for is_thought, text in marked if is_thought]
        assert len(thinking) == meta["reasoning_tokens"]
        assert "".join(thinking) == THOUGHT
        assert "".join(text for is_thought, text in marked if not is_thought) == ANSWER
        assert page.locator('#state-0 span.tok.thinking:not([data-gen="answer"])').count() == 0
        line = page.locator('#state-0 > .ops > .op.gen[data-name="answer"]').text_content()
        assert f"{meta['reasoning_tokens']} thinking" in line
        plain = page.locator('#state-0 > .ops > .op.gen[data-name="plain"]').text_content()
        assert "thinking" not in plain
        page.locator('span.tok[data-gen="answer"][data-i="1"]').hover()
        assert "in the thought, before the answer" in page.locator("#tip").text_content()
