"""What the isolation test files share: the engine they attack, three greedy streams decoding
while one hostile request is sent, /health probed meanwhile, and a refusal's check."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import LiveServer, stream_events

from braid.runtime import Engine

VICTIM_TOKENS = 200


@pytest.fixture(scope="module")
def engine(tiny_model_path: Path) -> Iterator[Engine]:
    """The engine the isolation files attack: the tiny model with room for 16 running
    requests and a 2 s compile limit."""
    engine = Engine(
        model=str(tiny_model_path),
        device="cpu",
        dtype="float32",
        max_kv_tokens=4096,
        max_running_requests=16,
        grammar_compile_timeout_s=2.0,
    )
    yield engine
    engine.shutdown()


async def _victim(url: str, http: httpx.AsyncClient, i: int, started: asyncio.Event) -> dict:
    body = {
        "prompt": f"Victim {i} says",
        "max_tokens": VICTIM_TOKENS,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = await stream_events(http, url, body, on_event=started.set)
    assert events[-1] == "[DONE]", events[-3:]
    return json.loads(events[-2])


async def decoding_victims(url: str, http: httpx.AsyncClient) -> list[asyncio.Task]:
    """Three greedy streams, returned once each has its first token."""
    starts = [asyncio.Event() for _ in range(3)]
    victims = [asyncio.create_task(_victim(url, http, i, s)) for i, s in enumerate(starts)]
    await asyncio.wait_for(asyncio.gather(*(s.wait() for s in starts)), 60)
    return victims


async def probe_health(
    url: str, http: httpx.AsyncClient, stop: asyncio.Event, limit_s: float = 1.0
) -> int:
    """Probe /health until stopped (for four minutes at most), each probe allowed `limit_s`;
    returns the probe count."""
    probes = 0
    deadline = time.monotonic() + 240
    while not stop.is_set():
        assert time.monotonic() < deadline, "the probes were never stopped"
        r = await http.get(url + "/health", timeout=limit_s)  # raises past the limit
        assert r.status_code == 200
        probes += 1
        await asyncio.sleep(0.02)
    return probes


def under_attack(
    server: LiveServer, path: str, health_limit_s: float = 1.0, **request
) -> httpx.Response:
    """Send one request (httpx.post keywords) while three greedy streams are decoding; check
    the streams finish whole and /health answered throughout, each probe within
    `health_limit_s`; return the response."""

    async def main() -> httpx.Response:
        async with httpx.AsyncClient(timeout=120) as http:
            victims = await decoding_victims(server.url, http)
            stop = asyncio.Event()
            health = asyncio.create_task(probe_health(server.url, http, stop, health_limit_s))
            response = await http.post(server.url + path, **request)
            finals = await asyncio.gather(*victims)
            stop.set()
            assert await health > 0
        for final in finals:
            assert "error" not in final, final
            assert final["usage"]["completion_tokens"] == VICTIM_TOKENS
        return response

    return asyncio.run(main())


def assert_refused(response: httpx.Response, status: int, *words: str) -> None:
    assert response.status_code == status, response.text
    message = response.json()["error"]["message"]
    for word in words:
        assert word in message, message
