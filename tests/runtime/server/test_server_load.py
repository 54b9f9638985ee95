"""The server under load on loopback: many concurrent streams, a third of them dropped early,
and a SIGTERM while a stream is in flight."""

from __future__ import annotations

import asyncio
import json
import signal
import threading

import httpx
from conftest import LiveServer, ServeProcess, assert_no_kv_leak, stream_events, wait_idle

from braid.runtime import Engine

CLIENTS = 48
TOKENS = 12


async def _client(url: str, http: httpx.AsyncClient, i: int) -> str:
    """Stream one completion; every third client leaves after its first two events."""
    body = {
        "prompt": f"Request {i}: once upon a time",
        "max_tokens": TOKENS,
        "ignore_eos": True,
        "temperature": 0.8,
        "seed": i,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if i % 3 == 0:
        await stream_events(http, url, body, leave_after=2)
        return "left"
    events = await stream_events(http, url, body)
    assert events[-1] == "[DONE]", events[-3:]
    usage = json.loads(events[-2])["usage"]
    finishes = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-2]]
    assert finishes[-1] == "length" and usage["completion_tokens"] == TOKENS
    return "done"


def test_many_streams_with_disconnects_leave_the_engine_idle(tiny_model_path):
    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=8192)
    server = LiveServer(engine)
    before = engine.stats()

    async def main() -> list[str]:
        limits = httpx.Limits(max_connections=CLIENTS)
        async with httpx.AsyncClient(limits=limits, timeout=120) as http:
            return await asyncio.gather(*(_client(server.url, http, i) for i in range(CLIENTS)))

    try:
        outcomes = asyncio.run(main())
        assert outcomes.count("done") == CLIENTS - CLIENTS // 3
        wait_idle(engine)
        after = engine.stats()
        assert after["running_requests"] == after["waiting_requests"] == 0
        assert_no_kv_leak(engine)
        # No request is lost: each finished, or was aborted when its client left.
        finished = after["requests_finished"] - before["requests_finished"]
        aborted = after["requests_aborted"] - before["requests_aborted"]
        assert finished + aborted == CLIENTS and aborted <= CLIENTS // 3
        assert server.server.config.app.state.service.num_active == 0
    finally:
        server.stop()
        engine.shutdown()


def test_sigterm_drains_in_flight_streams(tiny_model_path):
    with ServeProcess(tiny_model_path) as server:
        started = threading.Event()
        events: list[str] = []

        def stream() -> None:
            body = {"prompt": "Once upon", "max_tokens": 40, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        events.append(line[5:].strip())
                        started.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert started.wait(60)
        server.process.send_signal(signal.SIGTERM)
        reader.join(120)
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
        assert len(events) - 1 == 40  # one event per token: nothing was cut off
        # uvicorn re-raises the SIGTERM once drained, so the exit status says how it ended.
        assert server.process.wait(60) in (0, -signal.SIGTERM)
