"""What the isolation test files share: the engine they attack, three greedy streams decoding
while one hostile request is sent, /health probed meanwhile, and a refusal's check."""

from __future__ import annotations

import asyncio
import json
import threading
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


# The most CPU time the server's event loop may spend between two of its ticks. The work
# these tests caught on the loop held it for a second or more (a select tokenized there:
# 25 s; a logprob listing built there: 1.1 s); a healthy loop's longest stretch here is about
# half a second (a select's 1,024 leaves submitted at once). A loaded machine stretches the
# wall clock between ticks, not the loop thread's CPU time.
LOOP_CPU_LIMIT_S = 1.0


class LoopCpu:
    """Ticks on a live server's event loop every 10 ms and keeps in `most_s` the most CPU
    time the loop's thread spent between two ticks; `with` it around an attack."""

    def __init__(self, server: LiveServer) -> None:
        self.loop = server.server.servers[0].get_loop()
        self.most_s = 0.0
        self._last: float | None = None
        self._handle: asyncio.TimerHandle | None = None

    def _tick(self) -> None:
        now = time.thread_time()
        if self._last is not None:
            self.most_s = max(self.most_s, now - self._last)
        self._last = now
        self._handle = self.loop.call_later(0.01, self._tick)

    def __enter__(self) -> LoopCpu:
        self.loop.call_soon_threadsafe(self._tick)
        return self

    def __exit__(self, *exc: object) -> None:
        stopped = threading.Event()

        def stop() -> None:
            if self._handle is not None:
                self._handle.cancel()
            stopped.set()

        self.loop.call_soon_threadsafe(stop)
        assert stopped.wait(60), "the server's event loop never ran the watch's stop"


def assert_loop_free(cpu: LoopCpu) -> None:
    assert cpu.most_s < LOOP_CPU_LIMIT_S, (
        f"the event loop spent {cpu.most_s:.2f} s of CPU between two ticks"
    )


async def probe_health(url: str, http: httpx.AsyncClient, stop: asyncio.Event) -> int:
    """Probe /health until stopped (for four minutes at most), each answered with a 200;
    returns the probe count. That the loop answers promptly is LoopCpu's check: a probe's
    wall time is the machine's load as much as the server's."""
    probes = 0
    deadline = time.monotonic() + 240
    while not stop.is_set():
        assert time.monotonic() < deadline, "the probes were never stopped"
        r = await http.get(url + "/health", timeout=60)
        assert r.status_code == 200
        probes += 1
        await asyncio.sleep(0.02)
    return probes


def under_attack(server: LiveServer, path: str, **request) -> httpx.Response:
    """Send one request (httpx.post keywords) while three greedy streams are decoding; check
    the streams finish whole, /health answered throughout and the event loop was never held
    (LoopCpu); return the response."""

    async def main() -> httpx.Response:
        async with httpx.AsyncClient(timeout=120) as http:
            victims = await decoding_victims(server.url, http)
            stop = asyncio.Event()
            health = asyncio.create_task(probe_health(server.url, http, stop))
            with LoopCpu(server) as cpu:
                response = await http.post(server.url + path, **request)
                finals = await asyncio.gather(*victims)
            stop.set()
            assert await health > 0
            assert_loop_free(cpu)
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
