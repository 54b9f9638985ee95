"""Reasoning on /v1/chat/completions, through the openai client, on scripted models that think
and then answer (Qwen3 opening its own thought, R1 whose prompt opens it, GPT-OSS's analysis
channel): the thought in reasoning_content, the answer held to the schema after it, streamed
deltas adding up to the reply, how the thought comes back (separate_reasoning,
stream_reasoning, include_reasoning), and calls after a thought."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
import reasoning_cases
from reasoning_cases import ANSWER, CALL_THOUGHT, CHAT_FORMAT, SCHEMA, SERVED, THOUGHT, WEATHER
from reasoning_models import QUESTION

served = reasoning_cases.served

REQUEST = dict(model="tiny", messages=QUESTION, max_tokens=40, temperature=0)
THINKERS = ["qwen3", "r1", "gpt_oss"]


def extra(model, field: str):
    """A field the openai client does not know (reasoning_content...), as it parsed it."""
    return (model.model_extra or {}).get(field)


def streamed(client, **request) -> tuple[str, str, str | None, list]:
    """A streamed reply's (content, thought, finish_reason, chunks), its deltas concatenated;
    each chunk's `reasoning` alias agrees with its reasoning_content."""
    chunks = list(client.chat.completions.create(**request, stream=True))
    content, thought, finish = [], [], None
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content.append(delta.content or "")
        thought.append(extra(delta, "reasoning_content") or "")
        assert extra(delta, "reasoning") == extra(delta, "reasoning_content")
        finish = chunk.choices[0].finish_reason or finish
    return "".join(content), "".join(thought), finish, chunks


@pytest.mark.parametrize("name", THINKERS)
def test_the_answer_after_a_thought_is_the_models_own_under_the_schema(served, name):
    s = served(name)
    with s.openai() as client:
        out = client.chat.completions.create(**REQUEST, response_format=CHAT_FORMAT)
    message = out.choices[0].message
    assert message.content == ANSWER
    jsonschema.validate(json.loads(message.content), SCHEMA)
    assert extra(message, "reasoning_content") == extra(message, "reasoning") == THOUGHT
    assert out.choices[0].finish_reason == "stop"
    # Every output token before the answer is the thought's (its markers, a header); after it
    # comes the model's end token (whitespace may follow a document: the model ends it).
    details = out.usage.completion_tokens_details
    assert details.reasoning_tokens == out.usage.completion_tokens - len(s.tokens(ANSWER)) - 1
    assert details.reasoning_tokens > len(s.tokens(THOUGHT))


@pytest.mark.parametrize("name", THINKERS)
def test_streamed_deltas_add_up_to_the_reply(served, name):
    s = served(name)
    request = REQUEST | {"response_format": CHAT_FORMAT}
    with s.openai() as client:
        whole = client.chat.completions.create(**request)
        content, thought, finish, chunks = streamed(
            client, **request, stream_options={"include_usage": True}
        )
    assert (content, thought, finish) == (ANSWER, THOUGHT, "stop")
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == (
        whole.usage.completion_tokens_details.reasoning_tokens
    )
    # The thought streams piece by piece, before the answer.
    kinds = [
        "thought" if extra(c.choices[0].delta, "reasoning_content") else "text"
        for c in chunks
        if c.choices and (c.choices[0].delta.content or extra(c.choices[0].delta, "reasoning"))
    ]
    thoughts = len(s.tokens(THOUGHT))
    assert kinds[:thoughts] == ["thought"] * thoughts and "thought" not in kinds[thoughts:]


def test_a_free_answer_after_a_thought_is_split_too(served):
    with served("qwen3").openai() as client:
        out = client.chat.completions.create(**REQUEST)
        content, thought, _, _ = streamed(client, **REQUEST)
    assert out.choices[0].message.content == content == ANSWER
    assert extra(out.choices[0].message, "reasoning_content") == thought == THOUGHT


@pytest.mark.parametrize("name", ["qwen3", "r1"])
def test_separate_reasoning_false_leaves_the_thought_as_the_model_wrote_it(served, name):
    request = REQUEST | {
        "response_format": CHAT_FORMAT,
        "extra_body": {"separate_reasoning": False},
    }
    with served(name).openai() as client:
        out = client.chat.completions.create(**request)
        content, thought, _, _ = streamed(client, **request)
    message = out.choices[0].message
    # The thought's tags too; the answer after it still held to the schema.
    assert message.content == content == SERVED[name].text
    assert extra(message, "reasoning_content") is None and thought == ""


def test_stream_reasoning_false_sends_the_thought_in_one_piece(served):
    request = REQUEST | {"response_format": CHAT_FORMAT, "extra_body": {"stream_reasoning": False}}
    with served("qwen3").openai() as client:
        content, thought, _, chunks = streamed(client, **request)
    pieces = [extra(c.choices[0].delta, "reasoning_content") for c in chunks]
    assert [p for p in pieces if p] == [THOUGHT] and content == ANSWER
    first_text = next(i for i, c in enumerate(chunks) if c.choices[0].delta.content)
    assert pieces.index(THOUGHT) <= first_text  # with the answer's first piece at the latest


def test_include_reasoning_false_drops_the_thought_but_counts_it(served):
    request = REQUEST | {"response_format": CHAT_FORMAT, "extra_body": {"include_reasoning": False}}
    with served("qwen3").openai() as client:
        out = client.chat.completions.create(**request)
        content, thought, _, _ = streamed(client, **request)
        kept = client.chat.completions.create(**REQUEST, response_format=CHAT_FORMAT)
    message = out.choices[0].message
    assert message.content == content == ANSWER and thought == ""
    assert "reasoning_content" not in (message.model_extra or {})
    assert out.usage.completion_tokens_details.reasoning_tokens == (
        kept.usage.completion_tokens_details.reasoning_tokens
    )


def test_the_reasoning_fields_are_honoured_not_ignored(served):
    body = REQUEST | {
        "thinking_token_budget": 30,
        "max_thinking_tokens": 30,
        "custom_params": {"thinking_budget": 30},
        "include_reasoning": True,
        "separate_reasoning": True,
        "stream_reasoning": True,
        "thinking_budget_mode": "soft",
    }
    r = httpx.post(served("qwen3").url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert "x-braid-ignored-fields" not in r.headers
    assert r.json()["choices"][0]["message"]["reasoning_content"] == THOUGHT


NAMED = {"type": "function", "function": {"name": "weather"}}


# (GPT-OSS's scripted model cannot tell the prompt's turn start from the one after its
# thought, so only a grammar that allows calls alone makes it call.)
@pytest.mark.parametrize(
    "name,choice",
    [("qwen3_tool", "auto"), ("qwen3_tool", "required"), ("qwen3_tool", NAMED)]
    + [("gpt_oss_tool", "required"), ("gpt_oss_tool", NAMED)],
)
def test_a_call_after_a_thought(served, name, choice):
    request = REQUEST | {"tools": [WEATHER], "tool_choice": choice}
    with served(name).openai() as client:
        out = client.chat.completions.create(**request)
        content, thought, finish, chunks = streamed(client, **request)
    message, reason = out.choices[0].message, out.choices[0].finish_reason
    assert extra(message, "reasoning_content") == thought == CALL_THOUGHT
    [call] = message.tool_calls
    assert (call.function.name, call.function.arguments) == ("weather", "{}")
    assert reason == finish == "tool_calls" and not message.content and not content
    pieces = [p for c in chunks for p in c.choices[0].delta.tool_calls or ()]
    assert [(p.function.name, p.function.arguments) for p in pieces] == [("weather", "{}")]


@pytest.mark.parametrize(
    "name,body,named",
    [
        ("qwen3_tool", {"separate_reasoning": False}, "separate_reasoning"),
        ("gpt_oss_tool", {"reasoning": False}, "reasoning false"),
    ],
)
def test_calls_need_the_thought_split_off(served, name, body, named):
    request = REQUEST | {"tools": [WEATHER], "tool_choice": "required"} | body
    r = httpx.post(served(name).url + "/v1/chat/completions", json=request, timeout=60)
    assert r.status_code == 400 and named in r.json()["error"]["message"]
