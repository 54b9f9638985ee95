"""`braid trace FILE.py`: which run it traces (main(), else the last @program needing no
arguments) and the page it writes."""

from __future__ import annotations

import json
import re

import pytest

from braid.interpreter import backend as backends
from braid.runtime.cli.main import main
from braid.trace import TRACE_ENV

PROGRAMS = """
from braid import gen, program

@program
def first(s, topic="tea"):
    s += "First about " + topic + ": " + gen("x", max_tokens=3, temperature=0)

@program
def needs_topic(s, topic):
    s += topic

@program
def last(s, topic="coffee"):
    s += "Last about " + topic + ": " + gen("x", max_tokens=3, temperature=0)
"""
MAIN = """
from braid import gen, program

@program
def hello(s, topic):
    s += "Hello " + topic + ": " + gen("x", max_tokens=3, temperature=0)

def main():
    hello.run(topic="a")
    return hello.run(topic="b")
"""


@pytest.fixture
def trace_file(tmp_path, tiny_model_path, monkeypatch):
    """Runs `braid trace` on a program file in this process; returns the trace's data."""
    monkeypatch.setenv(TRACE_ENV, "0")  # the command turns tracing on; restored after
    monkeypatch.setattr(backends, "_default", None)  # the command's engine, dropped after
    model = ["--model", str(tiny_model_path), "--device", "cpu", "--dtype", "float32"]

    def run(source: str) -> dict | int:
        path, out = tmp_path / "prog.py", tmp_path / "out.html"
        path.write_text(source)
        code = main(["trace", str(path), "-o", str(out), *model])
        if code != 0:
            return code
        html = out.read_text()
        return json.loads(re.search(r"const TRACE = (.*);\n", html).group(1).replace("<\\/", "</"))

    yield run
    if backends._default is not None:
        backends._default.engine.shutdown()


def test_last_program_without_arguments(trace_file):
    data = trace_file(PROGRAMS)
    assert data["program"] == "last"
    segments = data["states"][0]["segments"]
    assert segments[0] == {"origin": "prompt", "text": "Last about coffee: "}
    assert {s["origin"] for s in segments[1:]} == {"generated"}


def test_main_returns_the_state(trace_file):
    data = trace_file(MAIN)
    segments = data["states"][0]["segments"]
    assert "".join(s["text"] for s in segments).startswith("Hello b: ")
    # The first run left its prompt's start in the prefix cache; the second found it there.
    assert segments[0]["origin"] == "cached" and "Hello".startswith(segments[0]["text"])


def test_no_runnable_program(trace_file, capsys):
    assert trace_file("from braid import program\n") == 2
    assert "no main() and no @program" in capsys.readouterr().err
