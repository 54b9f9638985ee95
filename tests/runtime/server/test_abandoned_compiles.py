"""Slow compiles whose clients are gone, over real sockets: clients that send a slow
constraint and hang up give up their compiles, so the next client's quick one is not queued
behind them; and a server told to stop while compiles are queued stops within its shutdown
deadline (a second SIGTERM at once), not after compiling the queue."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time

import httpx
import pytest
from conftest import LiveServer, ServeProcess, compile_taken, wait_for

from braid.runtime import Engine

# Each takes tens of seconds to compile on one worker (a{20000} unrolls to 20,000 states):
# six of them queued take minutes.
SLOW = [f"a{{{20000 + i}}}" for i in range(6)]
# Well within one slow compile, far within the six.
QUICK_WAIT_S = 30


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    """One compile worker with a limit past any compile here: a slow job ends only when
    nobody waits for it."""
    engine = Engine(
        model=str(tiny_model_path),
        device="cpu",
        dtype="float32",
        max_kv_tokens=4096,
        grammar_compile_workers=1,
        grammar_compile_timeout_s=600,
    )
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def server(engine):
    server = LiveServer(engine)
    yield server
    server.stop()


def _bodies(pattern: str) -> list[tuple[str, dict]]:
    """The slow pattern as each route takes a constraint."""
    return [
        ("/v1/completions", {"prompt": "x", "max_tokens": 1, "stop_regex": pattern}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "regex": pattern},
        ),
        ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 1, "regex": pattern}}),
    ]


def _send(url: str, path: str, body: dict) -> socket.socket:
    """A request written whole on a socket of its own, its answer never read."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


def test_clients_that_leave_give_up_their_compiles(engine, server):
    """Six clients (two on each of completions, chat and /generate) send slow constraints
    and hang up once the first compiles: a quick regex then compiles at once, not minutes
    later behind theirs."""
    taken = compile_taken(engine.grammars)
    sockets = [_send(server.url, *_bodies(pattern)[i % 3]) for i, pattern in enumerate(SLOW)]
    wait_for(taken, 60, "a compile worker to take a slow constraint")
    for sock in sockets:
        sock.close()
    body = {"prompt": "x", "max_tokens": 4, "regex": "(19|20)[0-9]{2}"}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=QUICK_WAIT_S)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"][0]["text"]) == 4


def _compiling(serve: ServeProcess) -> bool:
    """The server has a compile worker (made for the first constraint it compiles)."""
    metrics = httpx.get(serve.url + "/metrics", timeout=10).text
    for line in metrics.splitlines():
        if line.startswith("braid_grammar_workers_resident_bytes "):
            return float(line.split()[1]) > 0
    raise AssertionError("no braid_grammar_workers_resident_bytes in /metrics")


def _stopped_within(process: subprocess.Popen, seconds: float) -> bool:
    try:
        process.wait(seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


@pytest.mark.parametrize("second_signal", [False, True])
def test_sigterm_with_queued_compiles_stops_within_the_deadline(tiny_model_path, second_signal):
    """`braid serve` with six slow compiles queued, their clients waiting: SIGTERM stops it
    within --shutdown-timeout-s (the waiting requests cancelled), and with a long deadline a
    second SIGTERM stops it at once."""
    deadline_s = 600 if second_signal else 3
    flags = ["--grammar-compile-workers", "1", "--grammar-compile-timeout-s", "600"]
    flags += ["--shutdown-timeout-s", str(deadline_s)]
    with ServeProcess(tiny_model_path, *flags) as serve:
        sockets = [_send(serve.url, "/v1/completions", b) for b in _slow_completions()]
        wait_for(lambda: _compiling(serve), 60, "a compile worker to start")
        time.sleep(0.5)  # the rest queued behind the first
        serve.process.send_signal(signal.SIGTERM)
        if second_signal:
            assert not _stopped_within(serve.process, 2), "it did not drain at all"
            serve.process.send_signal(signal.SIGTERM)
        stopped = _stopped_within(serve.process, QUICK_WAIT_S)
        for sock in sockets:
            sock.close()
        assert stopped, "braid serve was still running"


def _slow_completions() -> list[dict]:
    return [{"prompt": "x", "max_tokens": 1, "stop_regex": pattern} for pattern in SLOW]
