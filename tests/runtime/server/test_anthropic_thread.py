"""Anthropic's message threads: the anthropic SDK's tool runner opens one with `thread` on its
first request. braid keeps no threads and answers as Anthropic answers a request it cannot
thread (a 400 whose details say `thread_unsupported_request`); the runner then sends every turn
with the whole history and no thread. Checked with the official SDK against a live server."""

from __future__ import annotations

import json

import anthropic
import httpx
import httpx2
import pytest
from conftest import WEATHER, LiveServer

from braid.runtime import Engine

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def engine(long_tiny_model):
    # The tools preamble needs the long context; a decisive head keeps the calls short.
    engine = Engine(model=str(long_tiny_model(8.0, tied=False)), device="cpu", dtype="float32")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def server(engine):
    server = LiveServer(engine)
    yield server
    server.stop()


def test_a_thread_is_refused_as_unsupported_with_its_error_code(server):
    body = {"model": "tiny", "max_tokens": 4, "messages": ASK, "thread": {"type": "create"}}
    r = httpx.post(server.url + "/v1/messages", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and "thread" in error["message"]
    assert error["details"] == {
        "error_code": "thread_unsupported_request",
        "unsupported": ["thread"],
    }
    for none in (False, None):  # no thread asked for: an ordinary request
        r = httpx.post(server.url + "/v1/messages", json=body | {"thread": none})
        assert r.status_code == 200, r.text
        assert r.json()["type"] == "message"


def test_the_sdk_tool_runner_goes_on_without_a_thread(server):
    sent: list[dict] = []

    def record(request: httpx2.Request) -> None:
        if request.url.path.startswith("/v1/messages"):
            sent.append(json.loads(request.read()))

    calls: list[dict] = []

    @anthropic.beta_tool(input_schema=WEATHER)
    def get_weather(city: str, unit: str) -> str:
        """Current weather in a city."""
        calls.append({"city": city, "unit": unit})
        return "sunny"

    http = httpx2.Client(event_hooks={"request": [record]})
    with anthropic.Anthropic(
        base_url=server.url, api_key="unused", max_retries=0, http_client=http
    ) as client:
        runner = client.beta.messages.tool_runner(
            model="tiny",
            max_tokens=48,
            messages=ASK,
            tools=[get_weather],
            tool_choice={"type": "tool", "name": "get_weather"},  # a call every turn
            max_iterations=2,
            extra_body={"temperature": 0},
        )
        replies = list(runner)
    # Turn 1 asked for a thread, was refused, and went again without one; turn 2 sent the
    # whole history (the question, the call, its result) without one.
    assert [b.get("thread") for b in sent] == [{"type": "create"}, None, None]
    assert "thread" not in sent[1] and "thread" not in sent[2]
    assert sent[1]["messages"] == ASK
    assert [m["role"] for m in sent[2]["messages"]] == ["user", "assistant", "user"]
    [result] = [b for b in sent[2]["messages"][2]["content"] if b["type"] == "tool_result"]
    [use] = [b for b in sent[2]["messages"][1]["content"] if b["type"] == "tool_use"]
    assert result["tool_use_id"] == use["id"]
    assert len(replies) == 2 and all(r.stop_reason == "tool_use" for r in replies)
    # Each call was whole and valid under the tool's schema (the server's grammar), and ran.
    assert calls == [b.input for r in replies for b in r.content if b.type == "tool_use"]
    assert all(c["unit"] in ("celsius", "fahrenheit") for c in calls)
