"""Reasoning on Anthropic's Messages API (/v1/messages), through the anthropic client, on
scripted models that think and then answer: a thinking block (empty signature) before the
text, the answer held to output_config.format's schema, thinking and signature deltas as the
SDK accumulates them, the thought's tokens in usage, thinking off, thinking blocks in the
history, and calls after a thought."""

from __future__ import annotations

import httpx
import pytest
import reasoning_cases
from reasoning_cases import ANSWER, CALL_THOUGHT, NO_ARGUMENTS, SCHEMA, THOUGHT
from reasoning_models import QUESTION

served = reasoning_cases.served

REQUEST = dict(
    model="tiny",
    messages=QUESTION,
    max_tokens=40,
    output_config={"format": {"type": "json_schema", "schema": SCHEMA}},
    extra_body={"temperature": 0},  # recent clients take no sampling arguments
)
THINKERS = ["qwen3", "r1", "gpt_oss"]
WEATHER = {"name": "weather", "description": "The forecast.", "input_schema": NO_ARGUMENTS}


def chat_reasoning_tokens(s) -> int:
    body = {"model": "tiny", "messages": QUESTION, "max_tokens": 40, "temperature": 0}
    body["response_format"] = {"type": "json_schema", "json_schema": {"schema": SCHEMA}}
    out = httpx.post(s.url + "/v1/chat/completions", json=body, timeout=60).json()
    return out["usage"]["completion_tokens_details"]["reasoning_tokens"]


@pytest.mark.parametrize("name", THINKERS)
def test_a_thinking_block_then_the_answer_under_the_schema(served, name):
    s = served(name)
    with s.anthropic() as client:
        out = client.messages.create(**REQUEST)
    thinking, text = out.content
    assert (thinking.type, thinking.thinking, thinking.signature) == ("thinking", THOUGHT, "")
    assert (text.type, text.text) == ("text", ANSWER)
    assert out.stop_reason == "end_turn"
    assert out.usage.output_tokens_details.thinking_tokens == chat_reasoning_tokens(s) > 0


@pytest.mark.parametrize("name", THINKERS)
def test_streamed_blocks_add_up_to_the_reply(served, name):
    with served(name).anthropic() as client:
        whole = client.messages.create(**REQUEST)
        with client.messages.stream(**REQUEST) as stream:
            events = list(stream)
            final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    raw = [e for e in events if e.type.startswith("content_block")]
    start = raw[0]
    assert start.type == "content_block_start" and start.index == 0
    assert start.content_block.model_dump() == {"type": "thinking", "thinking": "", "signature": ""}
    block = [e for e in raw if e.index == 0]
    deltas = [e.delta for e in block[1:-1]]
    assert "".join(d.thinking for d in deltas[:-1]) == THOUGHT
    assert {d.type for d in deltas[:-1]} == {"thinking_delta"}
    # The signature just before the block stops.
    assert (deltas[-1].type, deltas[-1].signature) == ("signature_delta", "")
    assert block[-1].type == "content_block_stop"
    text = [e for e in raw if e.index == 1 and e.type == "content_block_delta"]
    assert "".join(e.delta.text for e in text) == ANSWER
    assert final.usage.output_tokens_details.thinking_tokens == (
        whole.usage.output_tokens_details.thinking_tokens
    )


def test_thinking_disabled_renders_the_no_thinking_prompt(served):
    s = served("qwen3_off")
    thinking = {"type": "disabled"}
    with s.anthropic() as client:
        out = client.messages.create(**REQUEST, thinking=thinking)
        counted = client.messages.count_tokens(model="tiny", messages=QUESTION, thinking=thinking)
    assert [(b.type, b.text) for b in out.content] == [("text", ANSWER)]
    assert counted.input_tokens == len(s.prompt_ids)
    assert out.usage.output_tokens_details.thinking_tokens == 0


def test_display_omitted_leaves_the_thought_out(served):
    thinking = {"type": "enabled", "budget_tokens": 30, "display": "omitted"}
    with served("qwen3").anthropic() as client:
        out = client.messages.create(**REQUEST, thinking=thinking)
    assert [(b.type, b.text) for b in out.content] == [("text", ANSWER)]
    assert out.usage.output_tokens_details.thinking_tokens > 0


def test_thinking_blocks_in_the_history_are_the_assistants_thought(served):
    s = served("qwen3_tool")
    with s.anthropic() as client:
        first = client.messages.create(
            **REQUEST | {"output_config": None}, tools=[WEATHER], tool_choice={"type": "any"}
        )
        thinking, call = first.content
        assert thinking.thinking == CALL_THOUGHT and (call.name, call.input) == ("weather", {})
        result = {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny."}
        turns = QUESTION + [
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in first.content],
            },
            {"role": "user", "content": [result]},
        ]
        unthought = QUESTION + [
            {"role": "assistant", "content": [call.model_dump(exclude_none=True)]},
            {"role": "user", "content": [result]},
        ]

        def count(messages: list) -> int:
            body = dict(model="tiny", messages=messages, tools=[WEATHER])
            return client.messages.count_tokens(**body).input_tokens

        with_thought, without = count(turns), count(unthought)
    assistant = {
        "role": "assistant",
        "content": None,
        "reasoning_content": CALL_THOUGHT,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
        ],
    }
    tool = {"role": "tool", "tool_call_id": "c1", "content": "Sunny."}
    chat = {"model": "tiny", "messages": QUESTION + [assistant, tool], "max_tokens": 1}
    chat["tools"] = [{"type": "function", "function": {**WEATHER, "parameters": NO_ARGUMENTS}}]
    del chat["tools"][0]["function"]["input_schema"]
    r = httpx.post(s.url + "/v1/chat/completions", json=chat, timeout=60).json()
    # Qwen3's template renders the thought of a turn after the last user query.
    assert with_thought == r["usage"]["prompt_tokens"] > without


def test_a_call_after_a_thought_streams_as_blocks(served):
    request = REQUEST | {"output_config": None}
    with served("qwen3_tool").anthropic() as client:
        with client.messages.stream(**request, tools=[WEATHER]) as stream:
            final = stream.get_final_message()
    thinking, call = final.content
    assert thinking.thinking == CALL_THOUGHT
    assert (call.type, call.name, call.input) == ("tool_use", "weather", {})
    assert final.stop_reason == "tool_use"


@pytest.mark.parametrize(
    "body,named",
    [
        (
            {
                "messages": QUESTION
                + [
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "redacted_thinking", "data": "opaque"},
                            {"type": "text", "text": "Yes."},
                        ],
                    },
                    {"role": "user", "content": "Sure?"},
                ]
            },
            "redacted_thinking",
        ),
        ({"thinking": {"type": "enabled"}}, "budget_tokens"),
        ({"thinking": {"type": "disabled", "budget_tokens": 5}}, "budget_tokens"),
        ({"thinking": {"type": "between_tools"}}, "thinking"),
        (
            {"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]},
            "thinking blocks belong in assistant messages",
        ),
    ],
)
def test_what_is_refused_is_named(served, body, named):
    base = {"model": "tiny", "messages": QUESTION, "max_tokens": 4}
    r = httpx.post(served("qwen3").url + "/v1/messages", json=base | body, timeout=60)
    assert r.status_code == 400
    assert named in r.json()["error"]["message"]
