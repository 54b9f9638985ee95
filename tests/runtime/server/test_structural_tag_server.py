"""Structural tags over HTTP: OpenAI's response_format "structural_tag" (XGrammar's format and
the legacy structures + triggers) and SGLang's sampling_params.structural_tag (JSON text) on
the tiny model, whose output is checked against `re` (the `regex` package's partial match for
a reply cut by max_tokens) and jsonschema; fields braid cannot honour are a 400 naming them."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest
import regex

from braid.grammars.structural_tag import StructuralTag
from braid.grammars.structural_tag_regex import structural_tag_regex

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 6}, "days": {"enum": [1, 2, 3]}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
NOTE = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
SCHEMAS = {"forecast": CITY, "note": NOTE}
CALL = re.compile(r"<function=(\w+)>(.*?)</function>", re.DOTALL)


def call_tag(name: str) -> dict:
    content = {"type": "json_schema", "json_schema": SCHEMAS[name]}
    return {"type": "tag", "begin": f"<function={name}>", "content": content, "end": "</function>"}


# Exactly one call after a fixed opening: the tiny model must finish it to stop.
ONE_CALL = {
    "type": "sequence",
    "elements": [
        {"type": "const_string", "value": "Calling: "},
        {
            "type": "triggered_tags",
            "triggers": ["<function="],
            "tags": [call_tag(name) for name in SCHEMAS],
            "at_least_one": True,
            "stop_after_first": True,
        },
    ],
}


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def pattern_of(tag: dict) -> str:
    return structural_tag_regex(StructuralTag.of(tag))


def check_calls(text: str) -> list[str]:
    """The names of the calls in `text`, each one's arguments valid under its schema."""
    names = []
    for name, arguments in CALL.findall(text):
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
        names.append(name)
    return names


def test_chat_response_format_structural_tag(client):
    tag = {"type": "structural_tag", "format": ONE_CALL}
    reply = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Forecast for Oslo?"}],
        response_format=tag,
        max_tokens=96,
        temperature=0.8,
        seed=3,
    )
    choice = reply.choices[0]
    text = choice.message.content
    assert choice.finish_reason == "stop", text
    assert re.fullmatch(pattern_of(tag), text), text
    assert text.startswith("Calling: <function=") and len(check_calls(text)) == 1, text


def test_vllms_structured_outputs_structural_tag(client):
    """vLLM's field: the tag as JSON text."""
    tag = {"type": "structural_tag", "format": ONE_CALL}
    reply = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Forecast for Oslo?"}],
        extra_body={"structured_outputs": {"structural_tag": json.dumps(tag)}},
        max_tokens=96,
        temperature=0.8,
        seed=3,
    )
    text = reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop", text
    assert re.fullmatch(pattern_of(tag), text) and len(check_calls(text)) == 1, text


def test_legacy_structures_and_triggers(server):
    tag = {
        "type": "structural_tag",
        "structures": [
            {"begin": f"<function={n}>", "schema": s, "end": "</function>"}
            for n, s in SCHEMAS.items()
        ],
        "triggers": ["<function="],
    }
    pattern = pattern_of(tag)
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Say something."}],
        "response_format": tag,
        "max_tokens": 24,
        "n": 3,
        "seed": 1,
    }
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        text = choice["message"]["content"]
        if choice["finish_reason"] == "stop":
            assert re.fullmatch(pattern, text), text
        else:  # cut by max_tokens: a prefix of a text in the language
            assert regex.fullmatch(pattern, text, partial=True), text
        check_calls(text)


def test_sglang_generate_takes_it_as_json_text(server):
    tag = {"type": "structural_tag", "format": ONE_CALL}
    params = {"structural_tag": json.dumps(tag), "max_new_tokens": 96, "temperature": 0.8}
    r = httpx.post(
        server.url + "/generate",
        json={"text": "Forecast:", "sampling_params": params | {"sampling_seed": 5}},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    out = r.json()
    text = out["text"]
    assert out["meta_info"]["finish_reason"]["type"] == "stop", text
    assert re.fullmatch(pattern_of(tag), text) and len(check_calls(text)) == 1, text


@pytest.mark.parametrize(
    "response_format, named",
    [
        (
            {
                "type": "structural_tag",
                "format": {"type": "sequence", "elements": [{"type": "foo"}]},
            },
            "structural_tag.format.elements[0].type: unknown format 'foo'",
        ),
        (
            {"type": "structural_tag", "format": {"type": "token", "token": "<|end|>"}},
            "structural_tag.format.type: format 'token' is not supported",
        ),
        (
            {"type": "structural_tag", "format": {"type": "any_text", "max_tokens": 4}},
            "structural_tag.format.max_tokens",
        ),
        ({"type": "structural_tag"}, "structural_tag"),
        ({"type": "json_object", "format": ONE_CALL}, "response_format.format is only for type"),
    ],
)
def test_what_braid_cannot_honour_is_a_400_naming_it(server, response_format, named):
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": response_format,
        "max_tokens": 4,
    }
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert named in r.json()["error"]["message"], r.text
