"""Function calling on OpenAI's Responses API (/v1/responses) through the official openai
client, on a tiny random model: it writes garbage, so every valid call is the constraint's
doing; calls checked against their tools' schemas, streamed and not, and a call's output sent
back renders as the same conversation does on /v1/chat/completions."""

from __future__ import annotations

import json

import jsonschema
import pytest
import responses_cases
from conftest import WEATHER
from responses_cases import ORDER, TOOLS, chat_text, events_of

from braid.runtime.server.chat import tools

# The engine and client fixtures both Responses test files use.
engine, client = responses_cases.engine, responses_cases.client

SCHEMAS = {"get_weather": WEATHER, "place_order": ORDER, "ping": {"type": "object"}}
ASK = "What is the weather in Paris?"


def check_calls(response, names=tuple(SCHEMAS)) -> list:
    """The response's output is whole calls, each naming one of `names` with arguments that
    validate against its tool's schema."""
    calls = response.output
    assert calls and all(c.type == "function_call" for c in calls), response.output
    for call in calls:
        assert call.call_id.startswith("call_") and call.id.startswith("fc_")
        assert call.status == "completed" and call.name in names
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    assert len({c.call_id for c in calls}) == len(calls)
    return calls


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_required_and_named_give_exactly_the_calls_asked_for(client, seed):
    one = client.responses.create(
        model="tiny",
        input=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=200,
        temperature=1.0,
        extra_body={"seed": seed},
    )
    assert one.status == "completed"
    [call] = check_calls(one)
    named = client.responses.create(
        model="tiny",
        input=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "name": "place_order"},  # one call, even parallel
        max_output_tokens=200,
        temperature=1.5,
        extra_body={"seed": seed},
    )
    [call] = check_calls(named, names=("place_order",))
    several = client.responses.create(
        model="tiny",
        input=ASK,
        tools=TOOLS[:1],
        tool_choice="required",
        max_output_tokens=300,
        temperature=1.0,
        extra_body={"seed": seed},
    )
    check_calls(several, names=("get_weather",))


def test_auto_is_text_or_whole_calls(engine, client):
    out = client.responses.create(
        model="tiny", input=ASK, tools=TOOLS, max_output_tokens=6, temperature=0
    )
    [message] = out.output
    assert message.type == "message" and not message.content[0].text.startswith("<t")
    # Biased towards the call marker's tokens (each used one pushed down by the penalties),
    # the model starts a call, which the constraint completes.
    marker = engine.tokenizer.encode(tools.MARK, add_special_tokens=False)
    bias = {str(t): 9 - 0.5 * i for i, t in enumerate(marker)}
    extra = {"logit_bias": bias, "presence_penalty": 2, "frequency_penalty": 2}
    out = client.responses.create(
        model="tiny",
        input=ASK,
        tools=TOOLS,
        parallel_tool_calls=False,
        max_output_tokens=200,
        temperature=0,
        extra_body=extra,
    )
    check_calls(out)
    none = client.responses.create(
        model="tiny",
        input=ASK,
        tools=TOOLS,
        tool_choice="none",
        max_output_tokens=4,
        temperature=0,
        extra_body=extra,
    )
    assert none.output[0].type == "message" and none.output_text.startswith("<")


@pytest.mark.parametrize("seed", [5, 6])
def test_streamed_calls_are_the_same_calls(client, seed):
    request = dict(
        model="tiny",
        input=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_output_tokens=300,
        temperature=1.0,
        extra_body={"seed": seed},
    )
    whole = client.responses.create(**request)
    expected = [(c.name, c.arguments) for c in check_calls(whole)]
    events = events_of(client, **request)
    assert events[-1].type == "response.completed"
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(c.name, c.arguments) for c in done] == expected
    arguments = {}
    for e in events:
        if e.type == "response.output_item.added":
            assert e.item.type == "function_call" and e.item.arguments == ""
            arguments[e.output_index] = ""
        elif e.type == "response.function_call_arguments.delta":
            arguments[e.output_index] += e.delta
        elif e.type == "response.function_call_arguments.done":
            assert e.arguments == arguments[e.output_index]
    assert list(arguments.values()) == [a for _, a in expected]
    assert [(c.name, c.arguments) for c in events[-1].response.output] == expected
    with client.responses.stream(**request) as stream:
        final = stream.get_final_response()
    assert [(c.name, c.arguments) for c in final.output] == expected


@pytest.mark.parametrize("max_output_tokens,num_whole", [(12, 0), (40, 0), (90, 1)])
def test_a_call_cut_off_never_appears(client, max_output_tokens, num_whole):
    """Calls cut off by max_output_tokens are dropped, streamed or not: what remains (here no
    call, or the one before the cut) is whole calls, and the response is incomplete."""
    request = dict(
        model="tiny",
        input=ASK,
        tools=TOOLS[1:2],
        tool_choice="required",
        max_output_tokens=max_output_tokens,
        temperature=1.0,
        extra_body={"seed": 9},
    )
    whole = client.responses.create(**request)
    assert whole.status == "incomplete"
    assert whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage.output_tokens == max_output_tokens
    assert len(whole.output) == num_whole
    if num_whole:
        check_calls(whole)
    events = events_of(client, **request)
    assert events[-1].type == "response.incomplete"
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [c.arguments for c in events[-1].response.output] == [c.arguments for c in whole.output]
    assert len(added) == num_whole


def test_function_call_output_round_trip(client):
    first = client.responses.create(
        model="tiny",
        input=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        max_output_tokens=200,
        temperature=0,
    )
    [call] = check_calls(first, names=("get_weather",))
    result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 21}'}
    # What an agent does: the history with the call as it came, then its output.
    history = [{"role": "user", "content": ASK}, call.model_dump(exclude_none=True), result]
    second = client.responses.create(
        model="tiny", input=history, tools=TOOLS, max_output_tokens=5, temperature=0
    )
    # The same conversation on chat completions: the same prompt, the same reply.
    chat = chat_text(
        client,
        [
            {"role": "user", "content": ASK},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.call_id, "content": '{"temp": 21}'},
        ],
        5,
        tools=[
            {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
            for t in TOOLS
        ],
    )
    assert second.usage.input_tokens == chat.usage.prompt_tokens > first.usage.input_tokens
    assert second.output_text == chat.choices[0].message.content
    # Continued from the stored response instead: the same prompt.
    continued = client.responses.create(
        model="tiny",
        previous_response_id=first.id,
        input=[result],
        tools=TOOLS,
        max_output_tokens=5,
        temperature=0,
    )
    assert continued.usage.input_tokens == second.usage.input_tokens
    assert continued.output_text == second.output_text
    assert continued.previous_response_id == first.id
