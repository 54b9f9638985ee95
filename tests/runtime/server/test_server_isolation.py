"""One hostile request must fail alone: each case runs while three normal streams decode, and
checks that they finish whole and that /health keeps answering within a second. Selects and
logprob listings, worked off the event loop: test_server_off_loop.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading

import hostile_cases
import httpx
import pytest
from conftest import LiveServer, assert_no_kv_leak, async_wait_for, compile_taken, wait_idle
from hostile_cases import (
    VICTIM_TOKENS,
    assert_refused,
    decoding_victims,
    under_attack,
)

from braid import grammars
from braid.runtime import SamplingParams
from braid.runtime.output.processor import OutputProcessor

# The engine both isolation test files attack.
engine = hostile_cases.engine


@pytest.fixture(scope="module")
def server(engine):
    server = LiveServer(engine, max_queued_requests=48, max_request_bytes=1_000_000)
    yield server
    server.stop()


def test_a_slow_stop_regex_compiles_off_the_loop_within_the_limit(server):
    body = {"prompt": "x", "max_tokens": 1, "stop_regex": "a{20000}"}
    r = under_attack(server, "/v1/completions", json=body)
    assert_refused(r, 400, "stop regex", "grammar_compile_timeout_s")


def test_a_slow_ebnf_grammar_compiles_off_the_loop_within_the_limit(server):
    body = {"prompt": "x", "max_tokens": 2, "grammar": "start: A\nA: /a{20000}/\n"}
    r = under_attack(server, "/v1/completions", json=body)
    assert_refused(r, 400, "grammar_compile_timeout_s")


def test_out_of_range_stop_token_ids_are_refused_at_the_wire(server):
    body = {"prompt": "Hello", "max_tokens": 8, "min_tokens": 2, "stop_token_ids": [-100000]}
    r = under_attack(server, "/v1/completions", json=body)
    assert_refused(r, 400, "stop_token_ids", "-100000")


def test_a_constraint_min_tokens_leaves_no_token_for_fails_that_request_alone(engine, server):
    b, c = engine.tokenizer.convert_tokens_to_ids(["b", "c"])
    body = {
        "prompt": "Letter:",
        "max_tokens": 4,
        "temperature": 1,
        "min_tokens": 1,
        "regex": "[bc]",
        "stop_token_ids": [b, c],
    }
    r = under_attack(server, "/v1/completions", json=body)
    assert_refused(r, 400, "min_tokens=1")


@pytest.mark.parametrize("prompts, n", [(40, 2), (10_000, 100)])
def test_sequences_past_what_the_server_can_hold_are_a_400_naming_the_bound(server, prompts, n):
    body = {"prompt": ["x"] * prompts, "max_tokens": 1, "n": n}
    r = under_attack(server, "/v1/completions", json=body)
    assert_refused(r, 400, f"{prompts * n} sequences", "at most 64")


def test_a_compile_worker_killed_mid_compile_fails_only_its_request(engine, server):
    """Both compile workers are killed while a slow stop regex compiles: that request alone
    fails (the streams decoding meanwhile finish whole), and the next constraint gets a new
    worker."""
    warm = 0
    while len(engine.grammars.worker_pids()) < 2:  # both compile threads have their worker
        jobs = [engine.grammars.compile(grammars.Regex(f"warm{warm + i}")) for i in range(2)]
        for job in jobs:
            job.result(60)
        warm += 2
    killed = set(engine.grammars.worker_pids())
    body = {"prompt": "x", "max_tokens": 1, "stop_regex": "b{20000}"}  # takes the 2 s limit

    async def main() -> httpx.Response:
        async with httpx.AsyncClient(timeout=120) as http:
            victims = await decoding_victims(server.url, http)
            taken = compile_taken(engine.grammars)
            request = asyncio.create_task(http.post(server.url + "/v1/completions", json=body))
            await async_wait_for(taken, 60, "a compile worker to take the stop regex")
            for pid in killed:
                os.kill(pid, signal.SIGKILL)
            response = await request
            for final in await asyncio.gather(*victims):
                assert final["usage"]["completion_tokens"] == VICTIM_TOKENS, final
            return response

    assert_refused(asyncio.run(main()), 400, "crashed the compile worker")
    body = {"prompt": "x", "max_tokens": 4, "regex": "(19|20)[0-9]{2}"}  # not cached
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200 and len(r.json()["choices"][0]["text"]) == 4, r.text
    assert engine.grammars.worker_pids() and not killed & set(engine.grammars.worker_pids())


def test_a_body_over_the_limit_is_a_413(server):
    prompt = "word " * 250_000  # 1.25 MB against the fixture's 1 MB limit
    r = under_attack(server, "/v1/completions", json={"prompt": prompt, "max_tokens": 1})
    assert_refused(r, 413, "1000000 bytes")

    def chunks():  # no Content-Length: the limit is found while reading
        yield b'{"prompt": "'
        for _ in range(200):
            yield b"x" * 10_000
        yield b'"}'

    r = httpx.post(server.url + "/v1/completions", content=chunks(), timeout=60)
    assert_refused(r, 413, "1000000 bytes")


def test_a_prompt_too_long_for_the_context_is_refused_before_it_is_tokenized(server):
    r = under_attack(server, "/v1/completions", json={"prompt": "y" * 900_000, "max_tokens": 1})
    assert_refused(r, 400, "900000 characters", "context of 512 tokens")
    # Under that bound it is tokenized (off the event loop), then refused by its token count.
    r = under_attack(server, "/v1/completions", json={"prompt": "a b " * 5_000, "max_tokens": 1})
    assert_refused(r, 400, "tokens", "context is 512")


def test_a_schema_nested_past_the_limit_is_a_400_naming_the_depth(server):
    schema = json.loads('{"type": "array", "items": ' * 600 + "{}" + "}" * 600)
    body = {"prompt": "x", "max_tokens": 1, "json_schema": schema}
    r = under_attack(server, "/v1/completions", json=body)
    assert_refused(r, 400, "nested 601 levels", "at most 128")


def test_generate_with_an_empty_rid_list_is_a_400(server):
    body = {"text": "x", "rid": [], "sampling_params": {"max_new_tokens": 1}}
    r = under_attack(server, "/generate", json=body)
    assert_refused(r, 400, "rid", "one per prompt")


def test_a_select_past_the_prompt_bound_is_refused_before_it_is_tokenized(server):
    """Each continuation is a prompt with the prefix: 4 of a 900 KB prefix blocked the loop."""
    body = {"prefix": "y" * 900_000, "continuations": ["a", "b", "c", "d"]}
    r = under_attack(server, "/braid/score", json=body)
    assert_refused(r, 400, "prefix + continuation has 900001 characters", "context of 512")


# ---- a conversation's text, counted before it is rendered ------------------------------------

HUGE = "z" * 900_000  # against the tiny model's bound of 512 tokens x 81 characters


def _chat(**fields) -> dict:
    return {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, **fields}


def _tool_described(description: str) -> dict:
    function = {"name": "f", "description": description, "parameters": {"type": "object"}}
    return {"type": "function", "function": function}


@pytest.mark.parametrize(
    "path, body, what",
    [
        (
            "/v1/chat/completions",
            _chat(tools=[_tool_described(HUGE)]),
            "messages has 900",
        ),
        (
            "/v1/chat/completions",
            _chat(
                messages=[
                    {"role": "user", "content": "Call it"},
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "call_0",
                                "type": "function",
                                "function": {"name": "f", "arguments": json.dumps({"a": HUGE})},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "call_0", "content": "done"},
                ],
            ),
            "messages has 900",
        ),
        (
            "/v1/chat/completions",
            _chat(messages=[{"role": "user", "content": ""}] * 25_000),
            "the conversation as the chat template renders it has",
        ),
        (
            "/v1/messages",
            {
                "max_tokens": 1,
                "messages": [{"role": "user", "content": "Hi"}],
                "tools": [{"name": "f", "description": HUGE, "input_schema": {"type": "object"}}],
            },
            "messages has 900",
        ),
        (
            "/v1/responses",
            {
                "input": "Hi",
                "max_output_tokens": 1,
                "tools": [{"type": "function", "name": "f", "description": HUGE}],
            },
            "input has 900",
        ),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": ""}] * 25_000},
            "the conversation as the chat template renders it has",
        ),
    ],
    ids=[
        "tool description",
        "call arguments",
        "many messages",
        "anthropic tool",
        "responses tool",
        "tokenize many messages",
    ],
)
def test_a_conversation_too_long_to_fit_is_refused_before_it_is_tokenized(server, path, body, what):
    """Tools, calls and the template's own text count with the messages: 4 tools of 15 MB
    were rendered and tokenized in full before the 400 (90 s, 0.9 -> 5.8 GB)."""
    r = under_attack(server, path, json=body)
    assert_refused(r, 400, what, "characters", "context of 512")


# ---- a step that raises: only the request it comes from fails ------------------------------

POISON = "Poison pill"


@pytest.mark.parametrize("where", ["forward", "processing"])
def test_a_step_that_raises_fails_only_its_request(engine, monkeypatch, where):
    poison_ids = engine.encode(POISON)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompts = [f"Victim {i} says" for i in range(3)]
    expected = [engine.generate(p, params).text for p in prompts]
    run = engine.runner.run
    add_tokens = OutputProcessor._add_tokens

    def run_unless_poisoned(batch):
        if any(r.prompt_ids == poison_ids for r in batch.requests):
            raise RuntimeError("injected fault in the forward")
        return run(batch)

    def add_unless_poisoned(self, r, tokens, logprobs, now):
        if r.prompt_ids == poison_ids:
            raise RuntimeError("injected fault in processing")
        return add_tokens(self, r, tokens, logprobs, now)

    if where == "forward":
        monkeypatch.setattr(engine.runner, "run", run_unless_poisoned)
    else:
        monkeypatch.setattr(OutputProcessor, "_add_tokens", add_unless_poisoned)
    results: dict[str, object] = {}

    def call(prompt: str) -> None:
        try:
            results[prompt] = engine.generate(prompt, params).text
        except RuntimeError as e:
            results[prompt] = e

    threads = [threading.Thread(target=call, args=(p,)) for p in [*prompts, POISON]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [results[p] for p in prompts] == expected
    assert isinstance(results[POISON], RuntimeError) and "injected fault" in str(results[POISON])
    wait_idle(engine)
    assert_no_kv_leak(engine)


# ---- serve's own flags ------------------------------------------------------------------------


def test_the_api_keys_come_from_the_flags_a_file_or_the_environment(tmp_path, monkeypatch):
    import argparse

    from braid.runtime.server.serve import api_keys

    monkeypatch.delenv("BRAID_API_KEY", raising=False)
    args = argparse.Namespace(api_key=None, api_key_file=None)
    assert api_keys(args) == []
    monkeypatch.setenv("BRAID_API_KEY", "from-env")
    assert api_keys(args) == ["from-env"]
    (tmp_path / "key").write_text("from-file\n")
    assert api_keys(argparse.Namespace(api_key=None, api_key_file=tmp_path / "key")) == [
        "from-file"
    ]
    (tmp_path / "keys").write_text("first\n\n  second  \n")  # one a line; blank lines skipped
    assert api_keys(argparse.Namespace(api_key=None, api_key_file=tmp_path / "keys")) == [
        "first",
        "second",
    ]
    (tmp_path / "blank").write_text("\n \n")
    with pytest.raises(ValueError, match="empty"):
        api_keys(argparse.Namespace(api_key=None, api_key_file=tmp_path / "blank"))
    flags = argparse.Namespace(api_key=["one", "two"], api_key_file=None)
    assert api_keys(flags) == ["one", "two"]


def test_serve_help_gives_each_flag_its_meaning_and_default(capsys):
    import dataclasses

    from braid.runtime.cli.main import main
    from braid.runtime.config import EngineConfig, RequestLimits

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for field in [*dataclasses.fields(EngineConfig), *dataclasses.fields(RequestLimits)]:
        flag = "--" + field.name.replace("_", "-")
        meaning = " ".join(field.metadata["help"].split())
        # A repeatable flag (a tuple field) collects its entries in a list, empty by default.
        default = list(field.default) if isinstance(field.default, tuple) else field.default
        assert f"{meaning} (default: {default})" in text, flag
    assert "(default: 16777216)" in text and "BRAID_API_KEY" in text
