"""Anthropic's Messages API (/v1/messages) through the official anthropic client, on a tiny
random model: replies checked against the engine run directly and against the same
conversation on /v1/chat/completions, which shares its prompt rendering and tool calling."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import openai
import pytest
from conftest import WEATHER, LiveServer

from braid.runtime import Engine, SamplingParams

ORDER = {
    "type": "object",
    "properties": {
        "sku": {"enum": ["A1", "B2"]},
        "qty": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["sku", "qty"],
}
TOOLS = [
    {"name": "get_weather", "description": "Current weather in a city.", "input_schema": WEATHER},
    {"name": "place_order", "description": "Order an item.", "input_schema": ORDER},
]
SCHEMAS = {t["name"]: t["input_schema"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
STORY = [{"role": "user", "content": "Tell me a story."}]
# Recent anthropic clients take no sampling arguments (newer Claude models fix them): they go
# in extra_body, which every client takes.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def engine(long_tiny_model):
    path = long_tiny_model(8.0, tied=False)
    engine = Engine(model=str(path), device="cpu", dtype="float32", max_kv_tokens=8192)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def client(server):
    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0) as client:
        yield client


def blocks(message) -> list[tuple]:
    """A reply's content blocks without their ids (each reply's tool_use ids are its own)."""
    return [
        (b.type, b.text) if b.type == "text" else (b.type, b.name, b.input) for b in message.content
    ]


def count_tokens(server, **body) -> int:
    """/v1/messages/count_tokens over HTTP (the client has it from 0.4x, its dev floor is
    0.40); reply blocks as the client sends them back (the fields the server gave)."""
    body = json.loads(json.dumps(body, default=lambda block: block.model_dump(exclude_unset=True)))
    r = httpx.post(server.url + "/v1/messages/count_tokens", json={"model": "tiny", **body})
    assert r.status_code == 200, r.text
    return r.json()["input_tokens"]


def rendered(engine, messages: list[dict]) -> list[int]:
    return engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )


# ---- text ------------------------------------------------------------------------------------


def test_a_message_is_the_engines_greedy_reply(engine, client):
    out = client.messages.create(
        model="tiny",
        max_tokens=8,
        extra_body=GREEDY,
        system="Be brief.",
        messages=STORY,
        metadata={"user_id": "someone"},  # accepted, changes nothing
    )
    prompt = rendered(engine, [{"role": "system", "content": "Be brief."}, *STORY])
    direct = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=8))
    assert direct.finish_reason == "length" and direct.text
    assert out.id.startswith("msg_") and out.type == "message" and out.role == "assistant"
    assert out.model == "tiny"
    assert [(b.type, b.text) for b in out.content] == [("text", direct.text)]
    assert out.stop_reason == "max_tokens" and out.stop_sequence is None
    usage = out.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == len(prompt)
    assert usage.output_tokens == len(direct.token_ids)
    # The same prompt again: most of it is read from the prefix cache, and counted apart.
    again = client.messages.create(
        model="tiny",
        max_tokens=8,
        extra_body=GREEDY,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": STORY[0]["content"]}]}],
    )
    assert again.content[0].text == direct.text  # blocks render as the strings did
    assert again.usage.cache_read_input_tokens > 0
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == len(prompt)


def test_top_k_and_top_p_reach_the_sampler(client):
    greedy = client.messages.create(model="tiny", max_tokens=8, extra_body=GREEDY, messages=STORY)

    def hot(**extra) -> list[tuple]:
        sampling = {"temperature": 1.5} | extra
        out = client.messages.create(
            model="tiny", max_tokens=8, messages=STORY, extra_body=sampling
        )
        return blocks(out)

    assert hot(top_k=1) == blocks(greedy)
    assert hot(top_p=1e-6) == blocks(greedy)
    assert any(hot() != blocks(greedy) for _ in range(3))  # sampled, the reply varies


def test_streaming_gives_the_same_message_in_anthropics_events(server, client):
    request = dict(model="tiny", max_tokens=10, extra_body=GREEDY, messages=STORY)
    whole = client.messages.create(**request)
    with client.messages.stream(**request) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == whole.content[0].text
    assert blocks(final) == blocks(whole)
    assert final.stop_reason == whole.stop_reason == "max_tokens"
    assert final.usage.output_tokens == whole.usage.output_tokens
    total = final.usage.input_tokens + final.usage.cache_read_input_tokens
    assert total == whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    # On the wire: each event named as its data's type, in Anthropic's order.
    names = []
    raw = {"model": "tiny", "max_tokens": 10, "messages": STORY, "stream": True, **GREEDY}
    with httpx.stream("POST", server.url + "/v1/messages", json=raw) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    for name, data in zip(lines[::2], lines[1::2], strict=True):
        assert name.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[6:])["type"] == name[7:]
        names.append(name[7:])
    deltas = len(names) - 5
    assert deltas == len(pieces)
    assert names == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def test_stop_sequences(client):
    request = dict(model="tiny", max_tokens=12, extra_body=GREEDY, messages=STORY)
    full = client.messages.create(**request).content[0].text
    stop = full[len(full) // 2 :][:3]
    assert len(stop) == 3 and full.find(stop) > 0, f"unhelpful output for this test: {full!r}"
    stops = ["never-written", stop]
    out = client.messages.create(**request, stop_sequences=stops)
    assert out.content[0].text == full[: full.find(stop)]
    assert (out.stop_reason, out.stop_sequence) == ("stop_sequence", stop)
    with client.messages.stream(**request, stop_sequences=stops) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)
    assert blocks(final) == blocks(out)


def test_a_final_assistant_message_is_continued(engine, server, client):
    out = client.messages.create(
        model="tiny",
        max_tokens=6,
        extra_body=GREEDY,
        messages=[*STORY, {"role": "assistant", "content": "Once upon a time"}],
    )
    prompt = rendered(engine, STORY)
    prompt += engine.tokenizer.encode("Once upon a time", add_special_tokens=False)
    direct = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=6))
    assert out.content[0].text == direct.text  # the continuation only
    count = count_tokens(
        server, messages=[*STORY, {"role": "assistant", "content": "Once upon a time"}]
    )
    assert count == len(prompt)


def test_max_tokens_past_the_context_stops_at_its_end(engine, server, client):
    """As on Anthropic's newer models: refused nowhere, cut where the context ends."""
    words = "a " * 1980
    messages = [{"role": "user", "content": words}]
    room = engine.context_length - count_tokens(server, messages=messages)
    assert 0 < room < 100, f"unhelpful prompt for this test: {room} tokens of room"
    out = client.messages.create(
        model="tiny", max_tokens=4096, messages=messages, extra_body=GREEDY
    )
    assert out.stop_reason == "model_context_window_exceeded"
    assert out.usage.output_tokens == room
    fits = client.messages.create(
        model="tiny", max_tokens=room, messages=messages, extra_body=GREEDY
    )
    assert fits.stop_reason == "max_tokens" and blocks(fits) == blocks(out)


# ---- tools ----------------------------------------------------------------------------------


def check_tool_uses(message, names=tuple(SCHEMAS)) -> list:
    """The reply is whole tool_use blocks, each naming one of `names` with a valid input."""
    assert message.stop_reason == "tool_use", message
    assert message.content and all(b.type == "tool_use" for b in message.content)
    for block in message.content:
        assert block.id.startswith("toolu_") and block.name in names
        jsonschema.validate(block.input, SCHEMAS[block.name])
    assert len({b.id for b in message.content}) == len(message.content)
    return message.content


def test_tool_choice_any_and_tool_give_valid_tool_uses(client):
    out = client.messages.create(
        model="tiny",
        max_tokens=160,
        extra_body=GREEDY,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    [use] = check_tool_uses(out)
    out = client.messages.create(
        model="tiny",
        max_tokens=160,
        extra_body={"temperature": 1.0},
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "place_order", "disable_parallel_tool_use": True},
    )
    [use] = check_tool_uses(out, names=("place_order",))
    # "none" and "auto" (which the random model answers in text) give text.
    for choice in ({"type": "none"}, {"type": "auto"}):
        out = client.messages.create(
            model="tiny",
            max_tokens=6,
            extra_body=GREEDY,
            messages=ASK,
            tools=TOOLS,
            tool_choice=choice,
        )
        assert [b.type for b in out.content] == ["text"] and out.stop_reason == "max_tokens"


def test_streamed_tool_uses_are_the_same(client):
    request = dict(
        model="tiny",
        max_tokens=300,
        extra_body=GREEDY,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "any"},
    )
    whole = client.messages.create(**request)
    check_tool_uses(whole)
    events = list(client.messages.create(**request, stream=True))
    starts = [e.content_block for e in events if e.type == "content_block_start"]
    assert [(b.type, b.name, b.input) for b in starts] == [
        ("tool_use", b.name, {}) for b in whole.content
    ]
    assert all(b.id.startswith("toolu_") for b in starts)
    deltas = [e for e in events if e.type == "content_block_delta"]
    assert all(e.delta.type == "input_json_delta" for e in deltas)
    for i, block in enumerate(whole.content):
        assert json.loads("".join(e.delta.partial_json for e in deltas if e.index == i)) == (
            block.input
        )
    assert [e.delta.stop_reason for e in events if e.type == "message_delta"] == ["tool_use"]
    with client.messages.stream(**request) as stream:
        final = stream.get_final_message()
    assert blocks(final) == blocks(whole) and final.stop_reason == "tool_use"
    # This prompt and the call's forced opening are in the cache now: only the prompt counts.
    assert final.usage.input_tokens >= 0
    assert final.usage.cache_read_input_tokens == whole.usage.input_tokens + (
        whole.usage.cache_read_input_tokens
    )


def test_a_tool_result_round_trip_renders_as_on_chat_completions(server, client):
    first = client.messages.create(
        model="tiny",
        max_tokens=160,
        extra_body=GREEDY,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
    )
    [use] = check_tool_uses(first, names=("get_weather",))
    # What an agent does: append the reply as it came, then the results in a user message.
    history = [
        *ASK,
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "21 C"},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    out = client.messages.create(
        model="tiny", max_tokens=8, extra_body=GREEDY, messages=history, tools=TOOLS
    )
    # The same conversation in OpenAI's terms: the same prompt, the same greedy reply.
    chat = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    call = {
        "id": use.id,
        "type": "function",
        "function": {"name": use.name, "arguments": json.dumps(use.input, ensure_ascii=False)},
    }
    function_tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t["description"],
                "parameters": t["input_schema"],
            },
        }
        for t in TOOLS
    ]
    same = chat.chat.completions.create(
        model="tiny",
        max_tokens=8,
        extra_body=GREEDY,
        tools=function_tools,
        messages=[
            *ASK,
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": use.id, "content": "21 C"},
            {"role": "user", "content": "And tomorrow?"},
        ],
    )
    assert out.usage.input_tokens + out.usage.cache_read_input_tokens == same.usage.prompt_tokens
    assert out.usage.input_tokens + out.usage.cache_read_input_tokens > (
        first.usage.input_tokens + first.usage.cache_read_input_tokens
    )
    assert out.content[0].text == same.choices[0].message.content
    count = count_tokens(server, messages=history, tools=TOOLS)
    assert count == same.usage.prompt_tokens
    # A failed tool's result tells the model so: the prompt differs.
    history[2]["content"][0]["is_error"] = True
    assert count_tokens(server, messages=history, tools=TOOLS) > count


# ---- errors and the key -----------------------------------------------------------------------


def anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    """The error's message, once its status and Anthropic's shape are checked."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    return body["error"]["message"]


@pytest.mark.parametrize(
    "body,message",
    [
        ({"messages": STORY}, "max_tokens"),
        ({"max_tokens": 0, "messages": STORY}, "max_tokens"),
        ({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, "role"),
        ({"max_tokens": 4, "messages": []}, "messages must not be empty"),
        (
            {
                "max_tokens": 4,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is this?"},
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "image/png", "data": ""},
                            },
                        ],
                    }
                ],
            },
            "image blocks are not supported",
        ),
        (
            {
                "max_tokens": 4,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "toolu_1",
                                "content": [{"type": "image", "source": {}}],
                            }
                        ],
                    }
                ],
            },
            "image blocks are not supported",
        ),
        ({"max_tokens": 4, "messages": STORY, "temperature": -1}, "temperature"),
        ({"max_tokens": 4, "messages": STORY, "frequency_penalty": 1}, "frequency_penalty"),
        ({"max_tokens": 4, "messages": STORY, "tool_choice": {"type": "any"}}, "needs tools"),
        (
            {"max_tokens": 4, "messages": STORY, "tools": [{"type": "bash_20250124", "name": "b"}]},
            "bash_20250124",
        ),
        (
            {
                "max_tokens": 4,
                "messages": ASK,
                "tools": TOOLS,
                "tool_choice": {"type": "tool", "name": "nope"},
            },
            "not in tools",
        ),
    ],
)
def test_bad_requests_get_anthropics_400(server, body, message):
    r = httpx.post(server.url + "/v1/messages", json={"model": "tiny", **body})
    assert message in anthropic_error(r, 400, "invalid_request_error")


def test_errors_through_the_client(client):
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    with pytest.raises(anthropic.BadRequestError, match="image blocks are not supported") as e:
        client.messages.create(
            model="tiny", max_tokens=4, messages=[{"role": "user", "content": [image]}]
        )
    assert e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError, match="claude-x") as e:
        client.messages.create(model="claude-x", max_tokens=4, messages=STORY)
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError, match="stop_sequences"):
        client.messages.create(
            model="tiny", max_tokens=4, messages=STORY, stop_sequences=["x"] * 100
        )


def test_x_api_key_is_accepted_and_a_wrong_key_refused(engine):
    server = LiveServer(engine, api_key="sekret")
    try:
        request = dict(model="tiny", max_tokens=2, extra_body=GREEDY, messages=STORY)
        good = anthropic.Anthropic(base_url=server.url, api_key="sekret", max_retries=0)
        assert good.messages.create(**request).content
        bearer = anthropic.Anthropic(base_url=server.url, auth_token="sekret", max_retries=0)
        assert bearer.messages.create(**request).content
        bad = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as e:
            bad.messages.create(**request)
        assert e.value.body["error"]["type"] == "authentication_error"
        # The header works on the other routes too; a wrong one is refused in their shape.
        assert httpx.get(server.url + "/v1/models", headers={"x-api-key": "sekret"}).is_success
        r = httpx.get(server.url + "/v1/models", headers={"x-api-key": "sekre"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert httpx.get(server.url + "/v1/models").status_code == 401
    finally:
        server.stop()
