"""The server under load on loopback: many concurrent streams, a third of them dropped early,
and a SIGTERM while a stream is in flight."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
from conftest import assert_no_kv_leak, wait_idle
from serving import LiveServer

from runtime import Engine

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
    leaves = i % 3 == 0
    events = []
    async with http.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                events.append(line[5:].strip())
                if leaves and len(events) == 2:
                    return "left"
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_drains_in_flight_streams(tiny_model_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "serve", "--model", str(tiny_model_path)]
        + ["--port", str(port), "--device", "cpu", "--dtype", "float32", "--max-kv-tokens", "2048"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline, "the server did not start"
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        started = threading.Event()
        events: list[str] = []

        def stream() -> None:
            body = {"prompt": "Once upon", "max_tokens": 40, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        events.append(line[5:].strip())
                        started.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert started.wait(60)
        process.send_signal(signal.SIGTERM)
        reader.join(120)
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
        assert len(events) - 1 == 40  # one event per token: nothing was cut off
        # uvicorn re-raises the SIGTERM once drained, so the exit status says how it ended.
        assert process.wait(60) in (0, -signal.SIGTERM)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
