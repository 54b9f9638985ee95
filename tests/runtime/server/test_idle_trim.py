"""Memory after requests refused before they reach the engine: the engine hands freed heap
back to the OS when it goes idle, but a 15 MB prompt refused at the context check never
wakes it, and its parsing and checking left the server ~14 MB larger for good. The server
now trims when its last request in flight ends."""

from __future__ import annotations

import time

import httpx
from conftest import ServeProcess


def _resident_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_refused_large_requests_leave_resident_memory_where_it_was(tiny_model_path):
    with ServeProcess(tiny_model_path) as serve:
        serve.post("/v1/completions", {"prompt": "Hello", "max_tokens": 2})
        time.sleep(1.5)
        before = _resident_mb(serve.process.pid)
        body = {"prompt": "word " * 3_000_000, "max_tokens": 1}  # 15 MB, past the context
        for _ in range(3):
            r = httpx.post(serve.url + "/v1/completions", json=body, timeout=120)
            assert r.status_code == 400 and "context" in r.text, r.text
            time.sleep(1.5)  # the trim runs in a thread once the request has ended
        grown = _resident_mb(serve.process.pid) - before
        assert grown < 6, f"resident memory grew {grown:.1f} MB over three refused prompts"
