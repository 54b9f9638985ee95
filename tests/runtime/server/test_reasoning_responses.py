"""Reasoning on OpenAI's Responses API (/v1/responses), through the openai client, on scripted
models that think and then answer: a reasoning item (its text as reasoning_text content)
before the message, the answer held to text.format's schema, the reasoning_text events as the
SDK's types name them, streamed deltas adding up to the reply, reasoning items given back as
input (and through previous_response_id) rendering as chat's reasoning_content, calls after a
thought, and what is refused."""

from __future__ import annotations

import json

import httpx
import pydantic
import pytest
import reasoning_cases
from openai.types.responses import ResponseStreamEvent
from reasoning_cases import ANSWER, CALL_THOUGHT, SCHEMA, THOUGHT, WEATHER
from reasoning_models import QUESTION

served = reasoning_cases.served

REQUEST = dict(model="tiny", input=QUESTION, max_output_tokens=40, temperature=0)
TEXT_FORMAT = {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA}}
EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)
THINKERS = ["qwen3", "r1", "gpt_oss"]


def sse(s, text: dict) -> list[dict]:
    """A streamed response's events as the JSON they came in."""
    body = REQUEST | {"text": text, "stream": True}
    with httpx.stream("POST", s.url + "/v1/responses", json=body, timeout=60) as r:
        blocks = r.read().decode().strip().split("\n\n")
    return [json.loads(b.split("\n")[1].removeprefix("data: ")) for b in blocks]


def chat_reasoning_tokens(client) -> int:
    out = client.chat.completions.create(
        model="tiny",
        messages=QUESTION,
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
    )
    return out.usage.completion_tokens_details.reasoning_tokens


@pytest.mark.parametrize("name", THINKERS)
def test_a_reasoning_item_then_the_answer_under_the_schema(served, name):
    with served(name).openai() as client:
        out = client.responses.create(**REQUEST, text=TEXT_FORMAT)
        chat_tokens = chat_reasoning_tokens(client)
    thought, message = out.output
    assert thought.type == "reasoning" and thought.id.startswith("rs_")
    assert thought.summary == [] and thought.status == "completed"
    assert [(c.type, c.text) for c in thought.content] == [("reasoning_text", THOUGHT)]
    assert message.type == "message" and out.output_text == ANSWER
    assert out.status == "completed"
    assert out.usage.output_tokens_details.reasoning_tokens == chat_tokens > 0


@pytest.mark.parametrize("name", THINKERS)
def test_streamed_events_are_the_sdks_and_add_up_to_the_reply(served, name):
    with served(name).openai() as client:
        whole = client.responses.create(**REQUEST, text=TEXT_FORMAT)
        events = list(client.responses.create(**REQUEST, text=TEXT_FORMAT, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [type(EVENTS.validate_python(data)) for data in sse(served(name), TEXT_FORMAT)] == [
        type(e) for e in events
    ]  # each event valid under the SDK's own types, as they came
    kinds = [e.type for e in events]
    deltas = kinds.count("response.reasoning_text.delta")
    assert kinds[: 4 + deltas + 3] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.reasoning_text.delta"] * deltas,
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    added, part = events[2], events[3]
    assert added.item.type == "reasoning" and added.item.status == "in_progress"
    assert part.part.type == "reasoning_text" and part.part.text == ""
    reasoning = [e for e in events if e.type.startswith("response.reasoning_text")]
    assert {(e.item_id, e.output_index, e.content_index) for e in reasoning} == {
        (added.item.id, 0, 0)
    }
    assert "".join(e.delta for e in reasoning[:-1]) == reasoning[-1].text == THOUGHT
    answer = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert answer == ANSWER
    done = events[-1].response
    assert done.status == "completed"
    dump = lambda r: [{k: v for k, v in i.model_dump().items() if k != "id"} for i in r.output]  # noqa: E731
    assert dump(done) == dump(whole)
    assert done.usage.output_tokens_details.reasoning_tokens == (
        whole.usage.output_tokens_details.reasoning_tokens
    )


def test_reasoning_items_given_back_are_the_next_turns_reasoning_content(served):
    s = served("qwen3_tool")
    with s.openai() as client:
        first = client.responses.create(**REQUEST, tools=[_tool()], tool_choice="required")
        thought, call = first.output
        assert thought.type == "reasoning" and thought.content[0].text == CALL_THOUGHT
        result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny."}
        given_back = [i.model_dump(exclude_none=True) for i in first.output]
        turn = REQUEST | {"tools": [_tool()], "max_output_tokens": 1}
        again = client.responses.create(**turn | {"input": QUESTION + given_back + [result]})
        stored = client.responses.create(
            **turn | {"input": [result]}, previous_response_id=first.id
        )
        # The same conversation on chat completions: the thought the assistant's.
        assistant = {
            "role": "assistant",
            "content": None,
            "reasoning_content": CALL_THOUGHT,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": "weather", "arguments": "{}"},
                }
            ],
        }
        tool = {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny."}
        chat = client.chat.completions.create(
            model="tiny", messages=QUESTION + [assistant, tool], max_tokens=1, tools=[WEATHER]
        )
        plain = client.chat.completions.create(
            model="tiny",
            messages=QUESTION + [assistant | {"reasoning_content": None}, tool],
            max_tokens=1,
            tools=[WEATHER],
        )
    # Qwen3's template renders the thought of a turn after the last user query.
    assert again.usage.input_tokens == stored.usage.input_tokens == chat.usage.prompt_tokens
    assert chat.usage.prompt_tokens > plain.usage.prompt_tokens


def _tool() -> dict:
    function = WEATHER["function"]
    return {"type": "function", **function}


def test_a_call_after_a_thought(served):
    with served("qwen3_tool").openai() as client:
        out = client.responses.create(**REQUEST, tools=[_tool()], tool_choice="auto")
        events = list(client.responses.create(**REQUEST, tools=[_tool()], stream=True))
    thought, call = out.output
    assert thought.content[0].text == CALL_THOUGHT
    assert (call.type, call.name, call.arguments) == ("function_call", "weather", "{}")
    items = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in items] == ["reasoning", "function_call"]


def test_effort_is_echoed_and_none_turns_thinking_off(served):
    with served("qwen3_off").openai() as client:
        out = client.responses.create(**REQUEST, text=TEXT_FORMAT, reasoning={"effort": "none"})
    assert out.reasoning.effort == "none" and out.reasoning.summary is None
    [message] = out.output  # no thought
    assert message.type == "message" and out.output_text == ANSWER
    assert out.usage.output_tokens_details.reasoning_tokens == 0


@pytest.mark.parametrize(
    "body,named",
    [
        ({"reasoning": {"summary": "auto"}}, "reasoning.summary"),
        ({"reasoning": {"generate_summary": "concise"}}, "reasoning.generate_summary"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"thinking_budget": 5}, "thinking_budget"),  # chat's, not a Responses field
    ],
)
def test_what_is_refused_is_named(served, body, named):
    r = httpx.post(served("qwen3").url + "/v1/responses", json=REQUEST | body, timeout=60)
    assert r.status_code == 400
    assert named in r.json()["error"]["message"]
