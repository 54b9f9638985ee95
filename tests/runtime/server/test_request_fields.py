"""Fields other servers' clients send: unknown ones ignored and named, vLLM's constraint
fields, fields braid lacks that would change the reply refused, chat_template_kwargs (on every
conversational route), and the legacy functions API. Through the official clients where they
can send them."""

from __future__ import annotations

import json
import re

import anthropic
import httpx
import jsonschema
import openai
import pytest

from braid.runtime import Engine

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=4096)
    # A template with a variable of its own, as Qwen3's enable_thinking.
    engine.tokenizer.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        "{% if shout is defined and shout %}LOUD{% endif %}<assistant>"
    )
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def test_unknown_fields_are_ignored_and_named(server):
    body = {"prompt": "Hi", "max_tokens": 2, "priority_hint": 3, "request_id": "x"}
    r = httpx.post(server.url + "/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.headers["x-braid-ignored-fields"] == "priority_hint, request_id"
    chat = {"messages": ASK, "max_tokens": 2, "stream": True, "my_extension": {"a": 1}}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=chat) as r:
        assert r.status_code == 200
        assert r.headers["x-braid-ignored-fields"] == "my_extension"
        assert "[DONE]" in r.read().decode()
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
    assert "x-braid-ignored-fields" not in r.headers
    # A client's names are escaped (no control characters, latin-1) and cut short.
    odd = {"prompt": "Hi", "max_tokens": 2, "caf\u00e9\n\U000dc082": 1, "x" * 5000: 2}
    r = httpx.post(server.url + "/v1/completions", json=odd)
    assert r.status_code == 200
    named = r.headers["x-braid-ignored-fields"]
    assert named.startswith("caf\\u00e9\\n\\udb30\\udc82, xxx") and named.endswith("...")
    assert len(named) < 1100


@pytest.mark.parametrize(
    "field,value",
    [
        ("include_stop_str_in_output", True),
        ("guided_whitespace_pattern", r"\s*"),
        ("use_beam_search", True),
        ("suffix", "z"),
        ("modalities", ["text", "audio"]),
    ],
)
def test_fields_that_would_change_the_reply_are_refused(server, field, value):
    r = httpx.post(
        server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, field: value}
    )
    assert r.status_code == 400
    assert f"{field} is not implemented by braid" in r.json()["error"]["message"]


def test_their_harmless_values_pass(server):
    body = {"prompt": "Hi", "max_tokens": 2, "include_stop_str_in_output": False}
    body |= {"use_beam_search": False, "modalities": ["text"]}
    r = httpx.post(server.url + "/v1/completions", json=body)
    assert r.status_code == 200 and "x-braid-ignored-fields" not in r.headers


def test_vllm_constraint_fields(client):
    number = {"type": "integer", "minimum": 0, "maximum": 99}
    schema = {"type": "object", "properties": {"n": number}, "required": ["n"]}
    for extra in (
        {"guided_json": schema},
        {"guided_json": json.dumps(schema)},
        {"structured_outputs": {"json": schema}},
    ):
        out = client.chat.completions.create(
            model="tiny", messages=ASK, max_tokens=30, seed=1, extra_body=extra
        )
        jsonschema.validate(json.loads(out.choices[0].message.content), schema)
    out = client.completions.create(
        model="tiny", prompt="Pick", max_tokens=5, extra_body={"guided_choice": ["yes", "no"]}
    )
    assert out.choices[0].text in ("yes", "no")
    out = client.completions.create(
        model="tiny",
        prompt="Code",
        max_tokens=8,
        extra_body={"structured_outputs": {"regex": "[A-Z]{2}[0-9]"}},
    )
    assert re.fullmatch("[A-Z]{2}[0-9]", out.choices[0].text)
    with pytest.raises(openai.BadRequestError, match="same constraint twice"):
        client.completions.create(
            model="tiny",
            prompt="x",
            max_tokens=2,
            extra_body={"regex": "a", "guided_regex": "b"},  # two different ones
        )
    with pytest.raises(openai.BadRequestError, match="structured_outputs.whitespace_pattern"):
        client.completions.create(
            model="tiny",
            prompt="x",
            max_tokens=2,
            extra_body={"structured_outputs": {"json": schema, "whitespace_pattern": " "}},
        )


def test_chat_template_kwargs_set_the_templates_variables(engine, client):
    loud = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        max_tokens=1,
        extra_body={"chat_template_kwargs": {"shout": True}},
    )
    quiet = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=1)
    loud_prompt = engine.tokenizer.apply_chat_template(ASK, shout=True, return_dict=False)
    assert loud.usage.prompt_tokens == len(loud_prompt)
    assert loud.usage.prompt_tokens > quiet.usage.prompt_tokens
    for taken in ("tokenize", "chat_template", "tokenizer_kwargs", "bos_token", "messages"):
        with pytest.raises(openai.BadRequestError, match=f"may not set {taken}"):
            client.chat.completions.create(
                model="tiny",
                messages=ASK,
                max_tokens=1,
                extra_body={"chat_template_kwargs": {taken: "x"}},
            )


def test_responses_and_messages_take_chat_template_kwargs(engine, server, client):
    """braid's extension on every conversational route: the variables reach the template
    (the prompt's count is the template's with them), its own arguments are refused."""
    loud_prompt = engine.tokenizer.apply_chat_template(ASK, shout=True, return_dict=False)
    loud_kwargs = {"chat_template_kwargs": {"shout": True}}
    request = dict(model="tiny", input=ASK, max_output_tokens=1)
    loud = client.responses.create(**request, extra_body=loud_kwargs)
    quiet = client.responses.create(**request)
    assert loud.usage.input_tokens == len(loud_prompt) > quiet.usage.input_tokens
    with pytest.raises(openai.BadRequestError, match="may not set tokenize"):
        client.responses.create(**request, extra_body={"chat_template_kwargs": {"tokenize": 1}})

    def prompt_tokens(usage) -> int:
        return usage.input_tokens + usage.cache_read_input_tokens

    request = dict(model="tiny", messages=ASK, max_tokens=1)
    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0) as messages:
        loud = messages.messages.create(**request, extra_body=loud_kwargs)
        quiet = messages.messages.create(**request)
        assert prompt_tokens(loud.usage) == len(loud_prompt) > prompt_tokens(quiet.usage)
        with pytest.raises(anthropic.BadRequestError, match="may not set tokenize"):
            taken = {"chat_template_kwargs": {"tokenize": 1}}
            messages.messages.create(**request, extra_body=taken)
    counted = httpx.post(
        server.url + "/v1/messages/count_tokens", json={"messages": ASK, **loud_kwargs}
    )
    assert counted.json() == {"input_tokens": len(loud_prompt)}


def test_legacy_functions(client):
    functions = [{"name": "get_weather", "description": "Weather", "parameters": WEATHER}]
    request = dict(
        model="tiny",
        messages=ASK,
        functions=functions,
        function_call={"name": "get_weather"},
        max_tokens=60,
    )
    calls = []
    for seed in range(5):
        choice = client.chat.completions.create(**request, seed=seed).choices[0]
        assert choice.finish_reason == "function_call"
        assert choice.message.tool_calls is None
        call = choice.message.function_call
        assert call.name == "get_weather"
        jsonschema.validate(json.loads(call.arguments), WEATHER)
        calls.append((call.name, call.arguments))
    streamed = list(client.chat.completions.create(**request, seed=0, stream=True))
    pieces = [c.choices[0].delta.function_call for c in streamed]
    assert [(p.name, p.arguments) for p in pieces if p] == calls[:1]
    assert streamed[-1].choices[0].finish_reason == "function_call"
    # The legacy turn of a call and its result renders, and is answered.
    call = {"name": "get_weather", "arguments": '{"city":"Paris"}'}
    history = ASK + [
        {"role": "assistant", "content": None, "function_call": call},
        {"role": "function", "name": "get_weather", "content": "sunny"},
    ]
    out = client.chat.completions.create(
        model="tiny", messages=history, functions=functions, function_call="none", max_tokens=3
    )
    assert out.choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError, match="not both"):
        client.chat.completions.create(
            model="tiny",
            messages=ASK,
            functions=functions,
            tools=[{"type": "function", "function": functions[0]}],
            max_tokens=3,
        )
    with pytest.raises(openai.BadRequestError, match="go with `functions`"):
        client.chat.completions.create(model="tiny", messages=history, max_tokens=3)


def test_a_completion_without_max_tokens_stops_at_16(server):
    # OpenAI's legacy completions and vLLM default to 16 tokens; a chat reply to the context.
    body = {"prompt": "Once upon a time", "temperature": 0, "ignore_eos": True}
    r = httpx.post(server.url + "/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 16
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_min_tokens_above_max_tokens_is_a_400_naming_both(server):
    body = {"prompt": "Hi", "max_tokens": 4, "min_tokens": 9}
    r = httpx.post(server.url + "/v1/completions", json=body)
    assert r.status_code == 400
    assert "min_tokens (9) must be <= max_tokens (4)" in r.json()["error"]["message"]
