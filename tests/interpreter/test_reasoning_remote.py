"""A reasoning program on RemoteBackend: the server reports its model's reasoning format and
generation prompts in /get_model_info, and the backend splits each reasoning output as a
LocalBackend does, so the program's variables, messages and text are the local run's (on
scripted Qwen3 and DeepSeek-R1 models: tests/reasoning_models.py)."""

from __future__ import annotations

import pytest
import reasoning_models
from conftest import LiveServer
from reasoning_models import QUESTION

from braid import LocalBackend, RemoteBackend, assistant, gen, program, user
from braid.runtime import Engine

scripted_models = reasoning_models.scripted_models
SCHEMA = {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"]}


@program
def verdict(s, budget):
    s += user(QUESTION[0]["content"])
    s += assistant(gen("answer", json_schema=SCHEMA, reasoning=budget, max_tokens=40))


@pytest.mark.parametrize("name, budget", [("qwen3_thinking", True), ("r1_thinking", 2)])
def test_a_reasoning_gen_on_a_server_equals_the_local_one(scripted_models, name, budget):
    path = scripted_models(name).path
    engine = Engine(model=str(path), device="cpu", dtype="float32", max_kv_tokens=4096)
    server = LiveServer(engine)
    try:
        remote, local = RemoteBackend(server.url), LocalBackend(engine)
        assert remote.reasoning_format == local.reasoning_format
        assert remote.generation_openings == local.generation_openings
        over_http = verdict.run(backend=remote, temperature=0, budget=budget)
        here = verdict.run(backend=local, temperature=0, budget=budget)
    finally:
        server.stop()
        engine.shutdown()
    assert over_http["answer"] == here["answer"]
    assert over_http["answer_reasoning_content"] == here["answer_reasoning_content"]
    assert over_http.meta("answer")["reasoning_tokens"] == here.meta("answer")["reasoning_tokens"]
    assert over_http.messages() == here.messages() and over_http.text() == here.text()
    thought = "I should say yes." if budget is True else "I should"
    assert here["answer_reasoning_content"] == thought


def test_a_server_without_the_fields_is_named():
    backend = RemoteBackend.__new__(RemoteBackend)
    backend.model_info = {"chat_template": None}  # an older server's model info
    backend.http = type("Http", (), {"base_url": "http://old"})()
    with pytest.raises(NotImplementedError, match="does not report"):
        _ = backend.reasoning_format
    assert backend.generation_openings is None
