"""OpenAI's Responses API (/v1/responses) through the official openai client, on a tiny random
model: its text checked against /v1/chat/completions (the same chat template and constraint),
its events against the SDK's types, its stored responses, what it refuses. Its function calls:
test_responses_tools.py."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pydantic
import pytest
import responses_cases
from conftest import LiveServer
from openai.types.responses import Response, ResponseStreamEvent
from responses_cases import TOOLS, chat_text, events_of

from braid.runtime.server.response_store import ResponseStore
from braid.runtime.server.wire import ChatMessage

# The engine and client fixtures both Responses test files use.
engine, client = responses_cases.engine, responses_cases.client

OK_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)


# ---- text ------------------------------------------------------------------------------------


def test_text_is_chats_text_with_usage(client):
    chat = chat_text(client, [{"role": "user", "content": "Tell me a story."}], 6)
    out = client.responses.create(
        model="tiny", input="Tell me a story.", max_output_tokens=6, temperature=0
    )
    assert out.id.startswith("resp_") and out.object == "response" and out.model == "tiny"
    [message] = out.output
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_")
    [part] = message.content
    assert part.type == "output_text" and part.annotations == []
    assert out.output_text == part.text == chat.choices[0].message.content
    # Cut off by max_output_tokens (the random model never stops within 6 tokens).
    assert chat.choices[0].finish_reason == "length"
    assert out.status == "incomplete" and message.status == "incomplete"
    assert out.incomplete_details.reason == "max_output_tokens"
    usage = out.usage
    assert usage.input_tokens == chat.usage.prompt_tokens
    assert usage.output_tokens == chat.usage.completion_tokens == 6
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert usage.input_tokens_details.cached_tokens > 0  # chat's request cached the prompt


def test_instructions_and_roles_are_chats_messages(client):
    out = client.responses.create(
        model="tiny",
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "Answer in French."},
            {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {"type": "message", "role": "assistant", "content": "Bonjour"},
            {"role": "user", "content": "Again"},
        ],
        max_output_tokens=5,
        temperature=0,
    )
    chat = chat_text(
        client,
        [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": "Answer in French."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Bonjour"},
            {"role": "user", "content": "Again"},
        ],
        5,
    )
    assert out.output_text == chat.choices[0].message.content
    assert out.usage.input_tokens == chat.usage.prompt_tokens
    assert out.instructions == "Be brief."


def test_json_schema_format_completes_and_validates(client):
    text = {"format": {"type": "json_schema", "name": "ok", "schema": OK_SCHEMA, "strict": True}}
    out = client.responses.create(
        model="tiny", input="Is it ok?", text=text, max_output_tokens=60, temperature=0
    )
    assert out.status == "completed" and out.output[0].status == "completed"
    assert out.incomplete_details is None
    jsonschema.validate(json.loads(out.output_text), OK_SCHEMA)
    assert out.text.format.type == "json_schema"

    class Verdict(pydantic.BaseModel):
        ok: bool

    parsed = client.responses.parse(
        model="tiny", input="Is it ok?", text_format=Verdict, max_output_tokens=60, temperature=0
    )
    assert isinstance(parsed.output_parsed, Verdict)
    assert parsed.output_parsed == Verdict.model_validate_json(parsed.output_text)

    # json_object: chat's response_format json_object, the same constraint. The random model
    # may not close its object: the text must then be what chat writes under it.
    out = client.responses.create(
        model="tiny",
        input="Any JSON object",
        text={"format": {"type": "json_object"}},
        max_output_tokens=60,
        temperature=0,
    )
    chat = chat_text(
        client,
        [{"role": "user", "content": "Any JSON object"}],
        60,
        response_format={"type": "json_object"},
    )
    assert out.output_text.lstrip().startswith("{")  # whitespace may open a document
    assert out.output_text == chat.choices[0].message.content
    if out.status == "completed":
        assert isinstance(json.loads(out.output_text), dict)


def test_the_body_is_the_sdks_response_type(server):
    """The raw body validates against the SDK's own model (strictly, not as the client
    builds it unchecked), with OpenAI's echoes of the request."""
    body = {
        "model": "tiny",
        "input": "Hi",
        "max_output_tokens": 3,
        "tools": TOOLS[:1],
        "metadata": {"run": "7"},
        "user": "someone",
    }
    raw = httpx.post(server.url + "/v1/responses", json=body, timeout=60).json()
    out = Response.model_validate(raw)
    assert out.metadata == {"run": "7"} and out.user == "someone"
    assert out.tool_choice == "auto" and out.parallel_tool_calls is True
    assert [t.name for t in out.tools] == ["get_weather"] and out.tools[0].strict
    assert out.store is True and out.truncation == "disabled" and out.text.format.type == "text"
    assert out.temperature == 1.0 and out.top_p == 1.0


# ---- streaming -------------------------------------------------------------------------------


def test_streamed_text_is_the_same_text(client):
    request = dict(model="tiny", input="Tell me a story.", max_output_tokens=8, temperature=0)
    whole = client.responses.create(**request)
    events = events_of(client, **request)
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text
    assert events[-1].response.id == events[0].response.id
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens == 8


def test_the_sdks_stream_helper_assembles_the_response(client):
    request = dict(
        model="tiny",
        input="Is it ok?",
        text={"format": {"type": "json_schema", "name": "ok", "schema": OK_SCHEMA}},
        max_output_tokens=60,
        temperature=0,
    )
    whole = client.responses.create(**request)
    with client.responses.stream(**request) as stream:
        seen = [e.type for e in stream]
        final = stream.get_final_response()
    assert seen[-1] == "response.completed"
    assert final.status == "completed" and final.output_text == whole.output_text
    jsonschema.validate(json.loads(final.output_text), OK_SCHEMA)


def test_sse_lines_name_each_event_and_validate(server):
    body = {"model": "tiny", "input": "Hi", "max_output_tokens": 4, "stream": True}
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        blocks = r.read().decode().strip().split("\n\n")
    assert not any("[DONE]" in b for b in blocks)  # the Responses API sends none
    for block in blocks:
        event_line, data_line = block.split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {data['type']}"
        EVENTS.validate_python(data)


# ---- stored responses ------------------------------------------------------------------------


def test_previous_response_id_continues_the_conversation(client):
    first = client.responses.create(
        model="tiny", instructions="Be brief.", input="Hello", max_output_tokens=4, temperature=0
    )
    second = client.responses.create(
        model="tiny",
        previous_response_id=first.id,
        input="And then?",
        max_output_tokens=4,
        temperature=0,
    )
    # OpenAI's rule: the earlier instructions are not carried over.
    chat = chat_text(
        client,
        [
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And then?"},
        ],
        4,
    )
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    assert second.output_text == chat.choices[0].message.content
    assert client.responses.retrieve(first.id).model_dump() == first.model_dump()
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError, match=first.id):
        client.responses.retrieve(first.id)
    # The second holds the whole conversation: continuing it needs nothing deleted since.
    third = client.responses.create(
        model="tiny", previous_response_id=second.id, input="Go on", max_output_tokens=2
    )
    assert third.usage.input_tokens > second.usage.input_tokens


def test_unstored_and_unknown_ids_are_errors(client):
    unstored = client.responses.create(model="tiny", input="Hi", store=False, max_output_tokens=2)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    for response_id in (unstored.id, "resp_unknown"):
        with pytest.raises(openai.BadRequestError) as error:
            client.responses.create(
                model="tiny", previous_response_id=response_id, input="Hi", max_output_tokens=2
            )
        assert error.value.code == "previous_response_not_found"
        assert error.value.param == "previous_response_id"
        assert response_id in error.value.message
    with pytest.raises(openai.NotFoundError):
        client.responses.delete("resp_unknown")


def test_the_store_evicts_the_least_recently_used(engine):
    server = LiveServer(engine)
    try:
        server.server.config.app.state.response_store = ResponseStore(max_responses=2)
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        ids = [client.responses.create(input=f"n{i}", max_output_tokens=1).id for i in range(2)]
        client.responses.retrieve(ids[0])  # now the most recently used
        ids.append(client.responses.create(input="n2", max_output_tokens=1).id)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(ids[1])
        assert client.responses.retrieve(ids[0]).id == ids[0]
        assert client.responses.retrieve(ids[2]).id == ids[2]
        with pytest.raises(openai.BadRequestError, match="not found"):
            client.responses.create(previous_response_id=ids[1], input="x", max_output_tokens=1)
    finally:
        server.stop()


def test_store_bounds_by_count_and_bytes():
    history = [ChatMessage(role="user", content="x" * 100)]

    def body(i: int) -> dict:
        return {"id": f"resp_{i}", "output": []}

    store = ResponseStore(max_responses=3, max_bytes=10_000)
    for i in range(5):
        assert store.put(None, body(i), history)
    assert len(store) == 3 and store.get(None, "resp_1") is None
    assert store.get(None, "resp_2") is not None
    size = store.get(None, "resp_2").num_bytes
    tight = ResponseStore(max_responses=100, max_bytes=2 * size)
    for i in range(4):
        tight.put(None, body(i), history)
        assert tight.num_bytes <= 2 * size
    kept = [tight.get(None, f"resp_{i}") is not None for i in range(4)]
    assert kept == [False, False, True, True]
    assert not tight.put(None, body(9), [ChatMessage(role="user", content="y" * 3 * size)])
    assert tight.get(None, "resp_9") is None and len(tight) == 2
    assert tight.delete(None, "resp_3") and not tight.delete(None, "resp_3")
    assert tight.num_bytes == size


# ---- what is refused -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra,status,message",
    [
        ({"temprature": 1}, 400, "temprature"),
        ({"tools": [{"type": "web_search"}]}, 400, "web_search"),
        ({"tools": [{"type": "function", "name": "f", "parameters": None, "x": 1}]}, 400, "`x`"),
        ({"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}}, 400, "allowed"),
        ({"tool_choice": "required"}, 400, "needs tools"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            400,
            "input_image",
        ),
        ({"reasoning": {"summary": "auto"}}, 400, "reasoning.summary"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, 400, "call_id"),
        ({"input": []}, 400, "input must not be empty"),
        ({"truncation": "auto"}, 400, "truncation"),
        ({"reasoning": {"effort": "high"}}, 400, "reasoning.effort"),  # the model never thinks
        ({"include": ["message.output_text.logprobs"]}, 400, "logprobs"),
        ({"top_logprobs": 3}, 400, "top_logprobs"),
        ({"background": True}, 400, "background"),
        ({"max_tokens": 5}, 400, "max_output_tokens"),
        ({"n": 2}, 400, "n is not"),
        ({"max_output_tokens": 5000}, 400, "max_output_tokens is 5000"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "schema"),
        ({"conversation": "conv_1"}, 400, "conversation"),
        ({"model": "gpt-4o"}, 404, "gpt-4o"),
    ],
)
def test_bad_requests_name_what_is_wrong(server, extra, status, message):
    body = {"model": "tiny", "input": "Hi", "max_output_tokens": 2} | extra
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]["message"]


def test_accepted_and_ignored_fields_change_nothing(client):
    request = dict(model="tiny", input="Hi", max_output_tokens=4, temperature=0)
    reference = client.responses.create(**request)
    out = client.responses.create(
        **request,
        reasoning={"effort": None},
        truncation="disabled",
        include=["reasoning.encrypted_content"],
        service_tier="auto",
        prompt_cache_key="k",
        safety_identifier="s",
        max_tool_calls=3,
        parallel_tool_calls=True,
        text={"format": {"type": "text"}, "verbosity": "medium"},
        stream_options=None,
    )
    assert out.output_text == reference.output_text


def test_a_request_that_fails_midway_ends_its_stream_failed(engine, client):
    """A constraint whose every token is a stop token, under min_tokens, leaves no token to
    sample: a 400 before the response starts, a response.failed event once it has (the
    headers are out)."""
    b, c = engine.tokenizer.convert_tokens_to_ids(["b", "c"])
    request = dict(
        model="tiny",
        input="Letter:",
        max_output_tokens=4,
        extra_body={"regex": "[bc]", "stop_token_ids": [b, c], "min_tokens": 1},
    )
    with pytest.raises(openai.BadRequestError, match="min_tokens"):
        client.responses.create(**request)
    events = events_of(client, **request)
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.failed",
    ]
    failed = events[-1].response
    assert failed.status == "failed" and "min_tokens" in failed.error.message
    assert failed.id == events[0].response.id
