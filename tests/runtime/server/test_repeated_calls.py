"""A reply that repeats a call ends there, on every conversational route alike (the conversation
pipeline's streamer): a scripted engine writes a call and then the same call again and again,
as the default model does (test_tools.test_the_default_model_ends_its_calls); each route,
streamed or not, returns the one call as a finished reply of calls, and the engine request was
aborted at the repeat rather than run to max_tokens."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from conftest import WEATHER

from braid.runtime import Engine
from braid.runtime.protocol.outputs import StreamChunk
from braid.runtime.server.chat import tools

ARGUMENTS = {"city": "Paris", "unit": "celsius"}
# The call, written again and again (each piece one token), until the engine is told to stop.
LOOPING = (tools.call_text("get_weather", json.dumps(ARGUMENTS)) + "\n") * 6
PIECES = [LOOPING[i : i + 8] for i in range(0, len(LOOPING), 8)]
MAX_TOKENS = 400  # more than the script has: it ends by running out, as a model would not
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER_TOOL = {"name": "get_weather", "description": "Weather.", "parameters": WEATHER}
# The same request on each route: the tool, a reply of calls only, room for many.
CHAT = {
    "messages": ASK,
    "tools": [{"type": "function", "function": WEATHER_TOOL}],
    "tool_choice": "required",
    "max_tokens": MAX_TOKENS,
}
RESPONSES = {
    "input": ASK,
    "tools": [{"type": "function", **WEATHER_TOOL}],
    "tool_choice": "required",
    "max_output_tokens": MAX_TOKENS,
}
MESSAGES = {
    "messages": ASK,
    "tools": [{"name": "get_weather", "description": "Weather.", "input_schema": WEATHER}],
    "tool_choice": {"type": "any"},
    "max_tokens": MAX_TOKENS,
}


@pytest.fixture(scope="module")
def engine(long_tiny_model):
    engine = Engine(
        model=str(long_tiny_model(0.01, tied=True)),
        device="cpu",
        dtype="float32",
        max_kv_tokens=4096,
    )
    yield engine
    engine.shutdown()


@pytest.fixture
def aborted(engine, monkeypatch) -> list[int]:
    """engine.stream plays the script (a chunk a piece); engine.abort, which the server calls
    at the repeat, ends it as the engine does: a last chunk "abort" with the counts so far.
    Returns the ids aborted."""
    aborted: list[int] = []
    submitted: list[int] = []

    async def stream(ids, params, on_submit=None, **context):
        rid = len(submitted)
        submitted.append(rid)
        if on_submit is not None:
            on_submit(rid)
        for num_tokens, piece in enumerate(PIECES):
            if rid in aborted:
                yield StreamChunk("", [], "abort", meta=_meta(ids, num_tokens))
                return
            yield StreamChunk(piece, [42])
        yield StreamChunk("", [], "length", meta=_meta(ids, len(PIECES)))

    monkeypatch.setattr(engine, "stream", stream)
    monkeypatch.setattr(engine, "abort", aborted.append)
    return aborted


def _meta(ids: list[int], num_tokens: int) -> dict:
    return {"prompt_tokens": len(ids), "completion_tokens": num_tokens, "cached_tokens": 0}


def reply(api, final: str, stream: bool, request: dict):
    """The reply `api` (the SDK's responses or messages) gives `request`: created whole, or
    streamed and assembled by the SDK's stream helper (its method `final`)."""
    if not stream:
        return api.create(model="tiny", **request)
    with api.stream(model="tiny", **request) as events:
        return getattr(events, final)()


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completions_end_at_a_repeated_call(server, aborted, stream):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        if not stream:
            out = client.chat.completions.create(model="tiny", **CHAT)
            [choice] = out.choices
            calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
            finish, num_tokens = choice.finish_reason, out.usage.completion_tokens
        else:
            options = {"stream_options": {"include_usage": True}}
            chunks = list(
                client.chat.completions.create(model="tiny", **CHAT, stream=True, **options)
            )
            deltas = [c.choices[0].delta for c in chunks if c.choices]
            pieces = [p for d in deltas for p in d.tool_calls or ()]
            calls = [(p.function.name, p.function.arguments) for p in pieces]
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            num_tokens = chunks[-1].usage.completion_tokens
    assert [(name, json.loads(a)) for name, a in calls] == [("get_weather", ARGUMENTS)]
    assert finish == "tool_calls"
    assert aborted == [0] and num_tokens < len(PIECES)


@pytest.mark.parametrize("stream", [False, True])
def test_responses_end_at_a_repeated_call(server, aborted, stream):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        out = reply(client.responses, "get_final_response", stream, RESPONSES)
    assert [(c.type, c.name, json.loads(c.arguments)) for c in out.output] == [
        ("function_call", "get_weather", ARGUMENTS)
    ]
    assert out.status == "completed"
    assert aborted == [0] and out.usage.output_tokens < len(PIECES)


@pytest.mark.parametrize("stream", [False, True])
def test_messages_end_at_a_repeated_call(server, aborted, stream):
    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0) as client:
        out = reply(client.messages, "get_final_message", stream, MESSAGES)
    assert [(b.type, b.name, b.input) for b in out.content] == [
        ("tool_use", "get_weather", ARGUMENTS)
    ]
    assert out.stop_reason == "tool_use"
    assert aborted == [0] and out.usage.output_tokens < len(PIECES)
