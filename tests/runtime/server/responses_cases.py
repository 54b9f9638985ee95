"""What the Responses API's test files share: their engine and client fixtures, the tools
their requests list, the same conversation through /v1/chat/completions, a streamed
response's events."""

from __future__ import annotations

import openai
import pytest
from conftest import WEATHER

from braid.runtime import Engine


@pytest.fixture(scope="module")
def engine(long_tiny_model):
    path = long_tiny_model(0.01, tied=True)
    engine = Engine(model=str(path), device="cpu", dtype="float32", max_kv_tokens=8192)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


ORDER = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"enum": ["A1", "B2"]},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                },
                "required": ["sku", "qty"],
            },
            "minItems": 1,
            "maxItems": 3,
        },
        "express": {"type": "boolean"},
    },
    "required": ["items", "express"],
}
TOOLS = [
    {"type": "function", "name": "get_weather", "description": "Weather.", "parameters": WEATHER},
    {"type": "function", "name": "place_order", "description": "Order.", "parameters": ORDER},
    {"type": "function", "name": "ping", "description": "Is it up?", "parameters": None},
]


def chat_text(client, messages, max_tokens, **extra):
    """The same conversation through /v1/chat/completions."""
    return client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=max_tokens, temperature=0, **extra
    )


def events_of(client, **request) -> list:
    """A streamed response's events, numbered in order."""
    events = list(client.responses.create(**request, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events
