"""A conversation whose assistant turns carry their thought renders as transformers'
apply_chat_template renders it with the real templates (Qwen3's, R1's, GPT-OSS's): a thought
given apart (chat's reasoning_content, Responses' reasoning items, Messages' thinking blocks)
or written inline in the content (`<think>...</think>answer`, which the templates split and
strip themselves), and the template variables the thinking fields set. The prompts are the
pipeline's, from each route's own request translation."""

from __future__ import annotations

import asyncio
import copy

import pytest
import reasoning_cases
from reasoning_cases import CALL_THOUGHT, WEATHER
from reasoning_models import QUESTION, prompt_ids

from braid.runtime.server.chat import pipeline
from braid.runtime.server.chat.conversation import Conversation
from braid.runtime.server.chat.reasoning_fields import chat_thinking
from braid.runtime.server.routes import anthropic_wire, responses_wire
from braid.runtime.server.wire import ChatCompletionRequest, convert, openai_request

served = reasoning_cases.served

CALL = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "Sunny."}
AGAIN = {"role": "user", "content": "And tomorrow?"}


def chat_prompt(s, body: dict) -> list[int]:
    """The prompt /v1/chat/completions renders for `body` (its request read as the route
    reads it)."""
    body = {"model": "tiny", "max_tokens": 1} | body
    req, _, _ = openai_request(body, ChatCompletionRequest, s.engine.context_length)
    conversation = Conversation(
        req.messages,
        tools=req.tools,
        tool_choice=req.tool_choice,
        template_variables=req.chat_template_kwargs,
        thinking=chat_thinking(req),
    )
    return rendered(s, conversation)


def rendered(s, conversation: Conversation) -> list[int]:
    ids, _ = asyncio.run(pipeline.prompt(s.service, conversation))
    return ids


def reference(s, messages: list[dict], **kwargs) -> list[int]:
    """transformers' rendering, the calls' arguments as objects (as templates take them)."""
    messages = [
        m | {"tool_calls": [_parsed(c) for c in m["tool_calls"]]} if m.get("tool_calls") else m
        for m in messages
    ]
    return prompt_ids(s.tokenizer, messages, **kwargs)


def _parsed(call: dict) -> dict:
    return call | {"function": {"name": call["function"]["name"], "arguments": {}}}


def assistant(**fields) -> dict:
    return {"role": "assistant", "content": ""} | fields


@pytest.mark.parametrize(
    "turn",
    [
        assistant(reasoning_content=CALL_THOUGHT, tool_calls=[CALL]),
        assistant(reasoning=CALL_THOUGHT, tool_calls=[CALL]),  # the alias
        assistant(content=f"<think>\n{CALL_THOUGHT}\n</think>\n\n", tool_calls=[CALL]),
    ],
)
def test_qwen3_renders_a_calls_thought_as_its_template_does(served, turn):
    s = served("qwen3")
    messages = QUESTION + [turn, RESULT]
    expected = {k: v for k, v in turn.items() if k != "reasoning"}
    if "reasoning" in turn:
        expected["reasoning_content"] = turn["reasoning"]
    ours = chat_prompt(s, {"messages": messages, "tools": [WEATHER]})
    assert ours == reference(s, QUESTION + [expected, RESULT], tools=[WEATHER])
    # The thought is in the prompt: the template keeps it after the last user query.
    assert s.tokenizer.decode(ours).count(CALL_THOUGHT) == 1


@pytest.mark.parametrize("name", ["qwen3", "r1"])
def test_a_thought_inline_in_an_earlier_turn_is_cut_as_the_template_cuts_it(served, name):
    s = served(name)
    content = (
        "<think>\nThe sky is blue.\n</think>\n\nYes."
        if name == "qwen3"
        else ("The sky is blue.</think>Yes.")
    )
    messages = QUESTION + [assistant(content=content), AGAIN]
    ours = chat_prompt(s, {"messages": messages})
    assert ours == reference(s, messages)
    assert "The sky is blue." not in s.tokenizer.decode(ours)


def test_gpt_oss_renders_a_calls_thought_as_its_analysis(served):
    s = served("gpt_oss")
    turn = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    ours = chat_prompt(
        s,
        {
            "messages": QUESTION + [turn | {"reasoning_content": CALL_THOUGHT}, RESULT],
            "tools": [WEATHER],
        },
    )
    theirs = reference(s, QUESTION + [turn | {"thinking": CALL_THOUGHT}, RESULT], tools=[WEATHER])
    assert ours == theirs
    assert f"<|channel|>analysis<|message|>{CALL_THOUGHT}<|end|>" in s.tokenizer.decode(ours)


@pytest.mark.parametrize("effort", ["low", "high"])
def test_an_effort_is_the_templates_reasoning_effort(served, effort):
    s = served("gpt_oss")
    ours = chat_prompt(s, {"messages": QUESTION, "reasoning_effort": effort})
    assert ours == reference(s, QUESTION, reasoning_effort=effort)
    assert f"Reasoning: {effort}" in s.tokenizer.decode(ours)


@pytest.mark.parametrize(
    "fields,kwargs",
    [
        ({"reasoning_effort": "none"}, {"enable_thinking": False, "reasoning_effort": "none"}),
        ({"thinking_token_budget": 0}, {"enable_thinking": False}),
        ({"thinking_budget": 0, "chat_template_kwargs": {"enable_thinking": True}}, {}),
    ],
)
def test_thinking_off_sets_enable_thinking_unless_the_request_did(served, fields, kwargs):
    s = served("qwen3")
    ours = chat_prompt(s, {"messages": QUESTION} | fields)
    assert ours == reference(s, QUESTION, **kwargs)


def test_a_responses_reasoning_item_is_the_next_turns_thought(served):
    s = served("qwen3")
    items = QUESTION + [
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": CALL_THOUGHT}],
        },
        {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny."},
    ]
    tool = {"type": "function", **WEATHER["function"]}
    conversation = Conversation(  # (chat_messages names an easy message's type in place)
        responses_wire.chat_messages(copy.deepcopy(items)),
        tools=responses_wire.function_tools([tool]),
    )
    turn = assistant(reasoning_content=CALL_THOUGHT, tool_calls=[CALL])
    assert rendered(s, conversation) == reference(s, QUESTION + [turn, RESULT], tools=[WEATHER])


def test_a_messages_thinking_block_is_the_turns_thought(served):
    s = served("qwen3")
    function = WEATHER["function"]
    tool = {"name": "weather", "description": function["description"]}
    body = {
        "model": "tiny",
        "max_tokens": 1,
        "tools": [tool | {"input_schema": function["parameters"]}],
        "messages": QUESTION
        + [
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": CALL_THOUGHT, "signature": ""},
                    {"type": "tool_use", "id": "call_1", "name": "weather", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "Sunny."}],
            },
        ],
    }
    req = convert(body, anthropic_wire.MessagesRequest)
    turn = assistant(reasoning_content=CALL_THOUGHT, tool_calls=[CALL])
    expected = reference(s, QUESTION + [turn, RESULT], tools=[WEATHER])
    assert rendered(s, anthropic_wire.conversation(req)) == expected
    off = convert(body | {"thinking": {"type": "disabled"}}, anthropic_wire.MessagesRequest)
    assert rendered(s, anthropic_wire.conversation(off)) == reference(
        s, QUESTION + [turn, RESULT], tools=[WEATHER], enable_thinking=False
    )
