"""Request limits at the wire: every request past a bound is a 400 naming the field, the
bound and the `braid serve` flag, on every route that takes the field; a request at the
bound is served. And the grammar memory the server reports stays within its budget."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from conftest import LiveServer, assert_no_kv_leak, wait_idle

from braid.runtime import Engine
from braid.runtime.config import RequestLimits

LIMITS = RequestLimits(
    max_prompt_tokens=64,
    max_n=4,
    max_stop_strings=3,
    max_stop_length=20,
    max_choices=5,
    max_score_chars=1000,
    max_logit_bias=4,
    max_constraint_bytes=2000,
    max_schema_depth=10,
)
CONTEXT = 512  # the tiny model's
GRAMMAR_BUDGET_MB = 16


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    engine = Engine(
        model=str(tiny_model_path),
        device="cpu",
        dtype="float32",
        max_kv_tokens=4096,
        grammar_memory_mb=GRAMMAR_BUDGET_MB,
    )
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def server(engine):
    server = LiveServer(engine, limits=LIMITS)
    yield server
    server.stop()


def _nested(levels: int) -> dict:
    schema: dict = {}
    for _ in range(levels - 1):
        schema = {"type": "array", "items": schema}
    return schema


def _chat(**fields) -> dict:
    return {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **fields}


def _tool(parameters: dict) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


CASES = {
    "max_tokens past the context": (
        "/v1/completions",
        {"prompt": "Hello", "max_tokens": 10**12},
        ["max_tokens is 1000000000000", f"context is {CONTEXT} tokens", "at most"],
    ),
    "max_tokens a bigint": (
        "/v1/completions",
        {"prompt": "Hello", "max_tokens": 2**70},
        [f"max_tokens is {2**70}", f"context is {CONTEXT}"],
    ),
    "max_completion_tokens past the context": (
        "/v1/chat/completions",
        _chat(max_completion_tokens=CONTEXT),
        ["max_completion_tokens is 512", "at most"],
    ),
    "max_new_tokens past the context": (
        "/generate",
        {"text": "Hello", "sampling_params": {"max_new_tokens": 2**70}},
        [f"sampling_params.max_new_tokens is {2**70}", f"context is {CONTEXT}"],
    ),
    "a prompt past max_prompt_tokens": (
        "/v1/completions",
        {"prompt": "word " * 100, "max_tokens": 1},
        ["prompt has", "at most 64 (--max-prompt-tokens)"],
    ),
    "token ids past max_prompt_tokens": (
        "/v1/completions",
        {"prompt": list(range(100, 200)), "max_tokens": 1},
        ["prompt has 100 tokens", "at most 64 (--max-prompt-tokens)"],
    ),
    "a prompt too long to tokenize": (
        "/generate",
        {"text": "x" * 200_000, "sampling_params": {"max_new_tokens": 1}},
        ["prompt has 200000 characters", "64 tokens", "(--max-prompt-tokens)"],
    ),
    "messages past max_prompt_tokens": (
        "/v1/chat/completions",
        _chat(messages=[{"role": "user", "content": "word " * 100}]),
        ["prompt has", "at most 64 (--max-prompt-tokens)"],
    ),
    "n": ("/v1/completions", {"prompt": "x", "n": 5}, ["n is 5", "at most 4 (--max-n)"]),
    "n a bigint": ("/v1/chat/completions", _chat(n=2**70), [f"n is {2**70}", "(--max-n)"]),
    "best_of": (
        "/v1/completions",
        {"prompt": "x", "n": 2, "best_of": 9},
        ["best_of is 9", "at most 4 (--max-n)"],
    ),
    "n per batch item": (
        "/generate",
        {"text": ["x", "y"], "sampling_params": [{"n": 1}, {"n": 5}]},
        ["sampling_params[1].n is 5", "(--max-n)"],
    ),
    "stop strings": (
        "/v1/completions",
        {"prompt": "x", "stop": ["a", "b", "c", "d"]},
        ["stop has 4 entries", "at most 3 (--max-stop-strings)"],
    ),
    "stop token ids": (
        "/generate",
        {"text": "x", "sampling_params": {"stop_token_ids": [1, 2, 3, 4]}},
        ["sampling_params.stop_token_ids has 4 entries", "(--max-stop-strings)"],
    ),
    "a long stop regex": (
        "/v1/chat/completions",
        _chat(stop_regex="a" * 21),
        ["stop_regex has 21 characters in one entry", "at most 20 (--max-stop-length)"],
    ),
    "choices": (
        "/v1/completions",
        {"prompt": "x", "choices": list("abcdef")},
        ["choices has 6 options", "at most 5 (--max-choices)"],
    ),
    "logit_bias": (
        "/v1/completions",
        {"prompt": "x", "logit_bias": {str(i): 1 for i in range(5)}},
        ["logit_bias has 5 entries", "at most 4 (--max-logit-bias)"],
    ),
    "a long regex": (
        "/v1/completions",
        {"prompt": "x", "regex": "a" * 2001},
        ["regex is 2001 bytes", "at most 2000 (--max-constraint-bytes)"],
    ),
    "a large grammar": (
        "/generate",
        {"text": "x", "sampling_params": {"ebnf": 'start: "' + "a" * 2000 + '"'}},
        ["sampling_params.ebnf is", "(--max-constraint-bytes)"],
    ),
    "a large schema": (
        "/v1/completions",
        {"prompt": "x", "json_schema": {"enum": ["v" * 100] * 20}},
        ["json_schema is", "bytes", "(--max-constraint-bytes)"],
    ),
    "a deep schema": (
        "/v1/chat/completions",
        _chat(response_format={"type": "json_schema", "json_schema": {"schema": _nested(50)}}),
        [
            "response_format.json_schema.schema is nested 50 levels deep",
            "at most 10 (--max-schema-depth)",
        ],
    ),
    "a deep schema as text": (
        "/generate",
        {"text": "x", "sampling_params": {"json_schema": json.dumps(_nested(11))}},
        ["sampling_params.json_schema is nested 11 levels deep", "(--max-schema-depth)"],
    ),
    "a deep tool": (
        "/v1/chat/completions",
        _chat(tools=[_tool({"type": "object", "properties": {"a": _nested(12)}})]),
        ["tools[0].function.parameters is nested 14 levels deep", "(--max-schema-depth)"],
    ),
    "select continuations": (
        "/braid/score",
        {"prefix": "x", "continuations": list("abcdef")},
        ["continuations has 6 entries", "at most 5 (--max-choices)"],
    ),
    "a select's text to tokenize": (
        "/braid/score",
        {"prefix": "x" * 300, "continuations": list("abcd")},
        ["prefix + continuations has 1204 characters to tokenize", "(--max-score-chars)"],
    ),
    "a select past max_prompt_tokens": (
        "/braid/score",
        {"prefix": "word " * 100, "continuations": [" a"]},
        ["prompt has", "at most 64 (--max-prompt-tokens)"],
    ),
    "top_k a bigint": (
        "/v1/completions",
        {"prompt": "x", "top_k": 2**70},
        ["top_k must be >= 0 and < 2**63"],
    ),
    "seed a bigint": (
        "/v1/completions",
        {"prompt": "x", "seed": -(2**70)},
        ["seed must be in [-2**63, 2**63)"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_request_past_a_limit_is_a_400_naming_the_field_and_bound(server, case):
    path, body, words = CASES[case]
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    for word in words:
        assert word in message, message


def test_a_body_nested_thousands_deep_is_a_400(server):
    body = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = httpx.post(server.url + "/v1/completions", content=body, timeout=60)
    assert r.status_code == 400 and "nests" in r.json()["error"]["message"], r.text


def test_requests_at_the_bounds_are_served(server, engine):
    ids = engine.encode("Hello there")
    room = CONTEXT - len(ids)
    # (The regex ends the output after two digits: the bound is what is checked.)
    body = {"prompt": ids, "max_tokens": room, "regex": "[0-9]{2}", "stop": ["x", "y", "z"]}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200 and len(r.json()["choices"][0]["text"]) == 2, r.text
    body = {"prompt": list(range(100, 164)), "max_tokens": 2, "n": 4, "ignore_eos": True}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (64, 8)
    schema = _nested(10)
    r = httpx.post(
        server.url + "/generate",
        json={"text": "x", "sampling_params": {"json_schema": schema, "max_new_tokens": 4}},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    # 5 continuations (--max-choices) of 40 tokens, 1,000 characters to tokenize.
    select = {"prefix": "word " * 39, "continuations": [f" opt{i}" for i in range(5)]}
    r = httpx.post(server.url + "/braid/score", json=select, timeout=120)
    assert r.status_code == 200 and len(r.json()["logprobs"]) == 5, r.text
    wait_idle(engine)
    assert_no_kv_leak(engine)


def test_grammar_memory_is_reported_and_stays_within_the_budget(server, engine):
    for i in range(12):
        body = {"prompt": "Id:", "max_tokens": 8, "regex": f"(item{i}|other)-[a-z]{{2,{i + 3}}}"}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
    metrics = httpx.get(server.url + "/metrics").text
    values = {
        line.split()[0]: float(line.split()[1])
        for line in metrics.splitlines()
        if line and not line.startswith("#")
    }
    assert 0 < values["braid_grammar_memory_bytes"] <= GRAMMAR_BUDGET_MB << 20
    assert values["braid_grammar_cache_entries"] >= 1
    assert "braid_grammar_cache_evictions_total" in values
    assert values["braid_grammar_workers_resident_bytes"] > 0
    assert values["process_resident_memory_bytes"] > 0
    stats = engine.stats()
    assert 0 < stats["grammar_memory_bytes"] <= GRAMMAR_BUDGET_MB << 20


def test_limits_validate_themselves():
    with pytest.raises(ValueError, match="RequestLimits.max_n must be >= 1"):
        RequestLimits(max_n=0)
    with pytest.raises(ValueError, match="max_schema_depth must be <= 128"):
        RequestLimits(max_schema_depth=129)


def test_serve_builds_its_limits_from_the_flags(tiny_model_path, monkeypatch):
    from braid.runtime.cli.main import main
    from braid.runtime.server.http import shutdown

    apps = []
    monkeypatch.setattr(shutdown, "run", lambda app, **kw: apps.append(app))
    flags = ["--device", "cpu", "--dtype", "float32", "--max-kv-tokens", "256"]
    flags += ["--max-n", "2", "--max-prompt-tokens", "100", "--grammar-memory-mb", "64"]
    root = logging.getLogger()
    level = root.level
    try:
        assert main(["serve", "--model", str(tiny_model_path), *flags]) == 0
        service = apps[0].state.service
        assert service.limits == RequestLimits(max_n=2, max_prompt_tokens=100)
        assert service.engine.config.grammar_memory_mb == 64
    finally:
        root.setLevel(level)  # serve sets the process's log level
        for app in apps:
            app.state.service.engine.shutdown()
