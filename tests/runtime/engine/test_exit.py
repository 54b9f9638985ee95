"""A process that used an engine exits cleanly without calling shutdown(): the engine thread
is a daemon, and one still inside a torch op when the interpreter finalizes was ended by
pthread_exit as it took the GIL back, unwinding C++ frames that may not be unwound:
`terminate called without an active exception`, exit code 134."""

from __future__ import annotations

import subprocess
import sys

import pytest

# 64 decodes running when the script ends: the engine thread is inside a step at exit.
SCRIPT = """
import gc, sys, threading
from braid.runtime import Engine, SamplingParams

engine = Engine(model=sys.argv[1], device="cpu", dtype="float32", max_kv_tokens=8192)
params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
started, lock, first = threading.Event(), threading.Lock(), set()

def emit(rid):
    def on_chunk(chunk):
        with lock:
            first.add(rid)
            if len(first) == 64:
                started.set()
    return on_chunk

for i in range(64):
    engine.submit(f"request {i}", params, emit(i))
assert started.wait(120), "the 64 decodes did not start"
if sys.argv[2] == "dropped":  # no reference left to the engine; its thread still decodes
    del engine
    gc.collect()
print("exiting mid-decode", flush=True)
"""


@pytest.mark.parametrize("engine", ["kept", "dropped"])
def test_a_process_exits_cleanly_while_its_engine_decodes(tiny_model_path, engine):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_model_path), engine],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert "exiting mid-decode" in done.stdout, done.stderr
    assert done.returncode == 0, done.stderr[-2000:]
    assert "terminate called" not in done.stderr
