"""The Responses store against hostile sizes: its byte budget counts at least the memory it
holds (it counted JSON while holding dicts and ChatMessages, seven times larger), metadata
past OpenAI's bounds is a 400, and a large stored response is written without holding the
event loop (three clients fetching 13 MB held /health for seconds)."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
from hostile_cases import LoopCpu, assert_loop_free, probe_health

from braid.runtime.server import response_store
from braid.runtime.server.response_store import ResponseStore
from braid.runtime.server.routes.responses_wire import (
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_PAIRS,
    MAX_METADATA_VALUE_CHARS,
)
from braid.runtime.server.wire import ChatMessage, FunctionCall, ToolCall

# Metadata as large as OpenAI allows.
FULL_METADATA = {
    f"{i:0{MAX_METADATA_KEY_CHARS}d}": "v" * MAX_METADATA_VALUE_CHARS
    for i in range(MAX_METADATA_PAIRS)
}


@pytest.fixture
def store_of(server) -> Iterator[Callable[..., ResponseStore]]:
    """Give the module's server a store of its own (ResponseStore's arguments) for the test."""
    state = server.server.config.app.state

    def give(**bounds) -> ResponseStore:
        state.response_store = ResponseStore(**bounds)
        return state.response_store

    yield give
    state.response_store = None  # the next test's requests get a fresh default store


@pytest.fixture
def client(server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


# ---- what the budget counts -------------------------------------------------------------------


def _body(i: int, num_items: int) -> dict:
    """A response object shaped as the route builds it: many small output items (an agent's
    parallel calls), each a few dicts and strings."""
    calls = [
        {
            "id": f"fc_{i}_{j}",
            "type": "function_call",
            "status": "completed",
            "arguments": '{"city": "Paris"}',
            "call_id": f"call_{j}",
            "name": "get_weather",
        }
        for j in range(num_items)
    ]
    return {"id": f"resp_{i}", "object": "response", "output": calls, "metadata": FULL_METADATA}


def _history(num_messages: int) -> list[ChatMessage]:
    """A conversation of many short turns with tool calls, as chat_messages makes it."""
    out: list[ChatMessage] = []
    for j in range(num_messages // 3):
        call = ToolCall(id=f"call_{j}", function=FunctionCall("get_weather", '{"city": "Oslo"}'))
        out += [
            ChatMessage(role="user", content=f"And {j}?"),
            ChatMessage(role="assistant", tool_calls=[call]),
            ChatMessage(role="tool", tool_call_id=f"call_{j}", content="sunny"),
        ]
    return out


def _held_after(puts: Callable[[], None]) -> int:
    """The bytes allocated while `puts` ran and still held after it: what the store keeps
    (the responses are made inside `puts` and dropped once put). Only what this file's code
    and the store's allocated counts: the other threads a test session runs (engine loops,
    servers, compile threads) allocate meanwhile too."""
    gc.collect()
    tracemalloc.start()
    try:
        puts()
        gc.collect()
        snapshot = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    where = [tracemalloc.Filter(True, f) for f in (__file__, response_store.__file__)]
    return sum(trace.size for trace in snapshot.filter_traces(where).traces)


def test_the_budget_counts_at_least_what_the_store_holds():
    """Forty responses of 1,500 output items and 600 messages each: counted as JSON, the store
    held twice its count."""
    store = ResponseStore()

    def puts() -> None:
        for i in range(40):
            assert store.put(None, _body(i, 1500), _history(600))

    held = _held_after(puts)
    assert len(store) == 40
    # An upper bound, and an honest one: not more than a fifth over what is held.
    assert held <= store.num_bytes <= 1.2 * held, (held, store.num_bytes)


def test_an_entry_holds_no_more_than_it_counts_however_small():
    """An entry's own objects (its key, the ordered dict's node) are counted too: as JSON,
    5,000 empty responses counted a tenth of what they held."""
    store = ResponseStore(max_responses=10_000)

    def puts() -> None:
        for i in range(5000):
            assert store.put("tenant", {"id": f"resp_{i:032x}"}, [])

    held = _held_after(puts)
    assert held <= store.num_bytes <= 3 * held, (held, store.num_bytes)


def test_eviction_keeps_what_is_held_within_the_budget():
    budget = 4 * 1024 * 1024
    store = ResponseStore(max_bytes=budget)

    def puts() -> None:
        for i in range(60):
            assert store.put(None, _body(i, 800), _history(300))

    held = _held_after(puts)
    assert 1 < len(store) < 60 and store.num_bytes <= budget
    assert held <= budget, held
    # The latest are kept, and come back as they were put.
    assert store.get(None, "resp_59").messages() == _history(300)


def test_many_large_responses_through_the_server_stay_within_the_budget(store_of, client):
    """Twelve responses, each with a megabyte of `user` and metadata as large as allowed, into
    a budget of four: the process holds no more than the budget for them."""
    budget = 4 * 1024 * 1024
    store = store_of(max_bytes=budget)
    client.responses.create(input="Hi", max_output_tokens=1)  # warm: the server's caches
    ids = []

    def posts() -> None:
        for i in range(12):
            out = client.responses.create(
                input=f"Hi {i}", max_output_tokens=1, user="u" * 1_000_000, metadata=FULL_METADATA
            )
            ids.append(out.id)

    held = _held_after(posts)
    assert store.num_bytes <= budget and 1 < len(store) < 12
    # Slack for what the engine and the client keep of twelve small requests.
    assert held <= budget + 1024 * 1024, held
    last = client.responses.retrieve(ids[-1])
    assert last.user == "u" * 1_000_000 and last.metadata == FULL_METADATA


# ---- metadata -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "metadata, words",
    [
        ({f"k{i}": "v" for i in range(MAX_METADATA_PAIRS + 1)}, ["16 key-value pairs", "17"]),
        ({"k" * (MAX_METADATA_KEY_CHARS + 1): "v"}, ["keys", "64 characters", "65"]),
        ({"k": "v" * (MAX_METADATA_VALUE_CHARS + 1)}, ["values", "512 characters", "513"]),
        ({"k": 1}, ["str"]),
        ({"k": {"nested": "v"}}, ["str"]),
        (["k", "v"], ["object"]),
    ],
    ids=["pairs", "key", "value", "int value", "object value", "array"],
)
def test_metadata_past_openais_bounds_is_a_400_naming_it(client, store_of, metadata, words):
    store = store_of()
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(input="Hi", max_output_tokens=1, metadata=metadata)
    message = error.value.message
    assert "metadata" in message and all(w in message for w in words), message
    assert len(store) == 0


def test_metadata_at_openais_bounds_is_stored_and_returned(client, store_of):
    store_of()
    out = client.responses.create(input="Hi", max_output_tokens=1, metadata=FULL_METADATA)
    assert out.metadata == FULL_METADATA
    assert client.responses.retrieve(out.id).metadata == FULL_METADATA


# ---- a large stored response, fetched -------------------------------------------------------


def test_a_large_stored_response_is_fetched_without_holding_the_loop(server, store_of):
    """Ten clients fetch a 13 MB stored response three times each while /health is probed:
    encoded on the event loop at each GET (a quarter of a second each), it held the probes
    for seconds."""
    store = store_of()
    body = _body(0, 90_000)
    assert store.put(None, body, _history(3))
    expected = store.get(None, "resp_0").body
    assert len(expected) > 12_000_000

    async def fetch(http: httpx.AsyncClient) -> None:
        for _ in range(3):
            r = await http.get(server.url + "/v1/responses/resp_0")
            assert r.status_code == 200 and r.headers["content-type"] == "application/json"
            assert r.content == expected

    async def main() -> None:
        async with httpx.AsyncClient(timeout=120) as http:
            stop = asyncio.Event()
            health = asyncio.create_task(probe_health(server.url, http, stop))
            with LoopCpu(server) as cpu:
                await asyncio.gather(*(fetch(http) for _ in range(10)))
            stop.set()
            assert await health > 0
            assert_loop_free(cpu)

    asyncio.run(main())
    assert httpx.get(server.url + "/v1/responses/resp_0").json() == body
