"""A reasoning program on RayBackend: the actors' engines tell their reasoning format and
generation prompts, and split each reasoning output as a LocalBackend does, so the program's
variables, messages and text are the local run's."""

from __future__ import annotations

import pytest
import ray
import reasoning_models
from reasoning_models import QUESTION

from braid import assistant, gen, program, user
from braid.interpreter import LocalBackend, RayBackend
from braid.runtime import Engine

scripted_models = reasoning_models.scripted_models
SCHEMA = {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"]}


@program
def verdict(s):
    s += user(QUESTION[0]["content"])
    s += assistant(gen("answer", json_schema=SCHEMA, reasoning=True, max_tokens=40))


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.slow  # a Ray cluster's start (~25 s); the split itself is LocalBackend's
def test_a_reasoning_gen_on_ray_actors_equals_the_local_one(ray_cluster, scripted_models):
    path = scripted_models("r1_thinking").path  # 'I should say yes.</think>{"answer":true}'
    config = dict(model=str(path), device="cpu", dtype="float32", max_kv_tokens=4096)
    backend = RayBackend(num_actors=1, **config)
    engine = Engine(**config)
    try:
        local_backend = LocalBackend(engine)
        assert backend.reasoning_format == local_backend.reasoning_format
        assert backend.generation_openings == local_backend.generation_openings
        on_ray = verdict.run(backend=backend, temperature=0)
        local = verdict.run(backend=local_backend, temperature=0)
    finally:
        backend.shutdown()
        engine.shutdown()
    assert on_ray["answer"] == local["answer"] == '{"answer":true}'
    assert on_ray["answer_reasoning_content"] == local["answer_reasoning_content"]
    assert on_ray["answer_reasoning_content"] == "I should say yes."
    assert on_ray.messages() == local.messages() and on_ray.text() == local.text()
