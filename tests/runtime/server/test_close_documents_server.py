"""close_documents on the server's routes: honoured on chat completions (a braid extension
field, through the openai client's extra_body) and /generate's sampling_params, refused with
a 400 naming it when it is not a boolean."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from shared_cases import PERSON

from braid.runtime import SamplingParams

BUDGET = 34  # room for the shortest PERSON document (12 tokens), not for what the model writes
MESSAGES = [{"role": "user", "content": "A person, as JSON."}]


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def _chat(client, seed: int, **extra):
    return client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=BUDGET,
        seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
        extra_body=extra,
    ).choices[0]


def test_chat_documents_close_unless_turned_off(engine, client):
    prompt = engine.tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    for seed in range(4):
        jsonschema.validate(json.loads(_chat(client, seed).message.content), PERSON)
        off = _chat(client, seed, close_documents=False)
        params = SamplingParams(
            max_tokens=BUDGET, seed=seed, json_schema=PERSON, close_documents=False
        )
        assert off.message.content == engine.generate(prompt, params).text


def test_generate_takes_close_documents(engine, server):
    def text(close: bool) -> str:
        sampling = {"max_new_tokens": 8, "json_schema": json.dumps(PERSON), "seed": 1}
        body = {"text": "Person:", "sampling_params": {**sampling, "close_documents": close}}
        return httpx.post(server.url + "/generate", json=body).json()["text"]

    params = SamplingParams(max_tokens=8, seed=1, json_schema=PERSON, close_documents=False)
    assert text(False) == engine.generate("Person:", params).text
    body = {
        "text": "Person:",
        "sampling_params": {
            "max_new_tokens": 40,
            "seed": 1,
            "json_schema": json.dumps(PERSON),
            "close_documents": True,
        },
    }
    jsonschema.validate(
        json.loads(httpx.post(server.url + "/generate", json=body).json()["text"]), PERSON
    )


def test_a_close_documents_that_is_not_a_boolean_is_refused(server):
    body = {"model": "tiny", "messages": MESSAGES, "close_documents": "yes"}
    r = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert r.status_code == 400 and "close_documents" in r.json()["error"]["message"]
