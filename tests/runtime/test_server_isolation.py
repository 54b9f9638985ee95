"""One hostile request must fail alone: each case runs while three normal streams decode, and
checks that they finish whole and that /health keeps answering within a second."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time

import httpx
import pytest
from conftest import LiveServer, assert_no_kv_leak, stream_events, wait_idle

from braid import grammars
from braid.runtime import Engine, SamplingParams
from braid.runtime.output_processor import OutputProcessor

VICTIM_TOKENS = 200


@pytest.fixture(scope="module")
def engine(tiny_model_path):
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


@pytest.fixture(scope="module")
def server(engine):
    server = LiveServer(engine, max_queued_requests=48, max_request_bytes=1_000_000)
    yield server
    server.stop()


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


async def _decoding_victims(url: str, http: httpx.AsyncClient) -> list[asyncio.Task]:
    """Three greedy streams, returned once each has its first token."""
    starts = [asyncio.Event() for _ in range(3)]
    victims = [asyncio.create_task(_victim(url, http, i, s)) for i, s in enumerate(starts)]
    await asyncio.wait_for(asyncio.gather(*(s.wait() for s in starts)), 60)
    return victims


async def _health(url: str, http: httpx.AsyncClient, stop: asyncio.Event) -> int:
    """Probe /health until stopped (for four minutes at most), each probe allowed one second;
    returns the probe count."""
    probes = 0
    deadline = time.monotonic() + 240
    while not stop.is_set():
        assert time.monotonic() < deadline, "the probes were never stopped"
        r = await http.get(url + "/health", timeout=1.0)  # raises past one second
        assert r.status_code == 200
        probes += 1
        await asyncio.sleep(0.02)
    return probes


def under_attack(server: LiveServer, path: str, **request) -> httpx.Response:
    """Send one request (httpx.post keywords) while three greedy streams are decoding; check
    the streams finish whole and /health answered throughout; return the response."""

    async def main() -> httpx.Response:
        async with httpx.AsyncClient(timeout=120) as http:
            victims = await _decoding_victims(server.url, http)
            stop = asyncio.Event()
            health = asyncio.create_task(_health(server.url, http, stop))
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
            victims = await _decoding_victims(server.url, http)
            request = asyncio.create_task(http.post(server.url + "/v1/completions", json=body))
            await asyncio.sleep(0.3)  # its compile is on its way, or under way
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


# ---- a step that raises: only the request it comes from fails ------------------------------

POISON = "Poison pill"


@pytest.mark.parametrize("where", ["forward", "processing"])
def test_a_step_that_raises_fails_only_its_request(engine, monkeypatch, where):
    poison_ids = engine.encode(POISON)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompts = [f"Victim {i} says" for i in range(3)]
    expected = [engine.generate(p, params).text for p in prompts]
    run = engine.runner.run
    add_tokens = OutputProcessor.add_tokens

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
        monkeypatch.setattr(OutputProcessor, "add_tokens", add_unless_poisoned)
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


def test_the_api_key_comes_from_the_flag_a_file_or_the_environment(tmp_path, monkeypatch):
    import argparse

    from braid.runtime.server.serve import api_key

    monkeypatch.delenv("BRAID_API_KEY", raising=False)
    args = argparse.Namespace(api_key=None, api_key_file=None)
    assert api_key(args) is None
    monkeypatch.setenv("BRAID_API_KEY", "from-env")
    assert api_key(args) == "from-env"
    (tmp_path / "key").write_text("from-file\n")
    assert api_key(argparse.Namespace(api_key=None, api_key_file=tmp_path / "key")) == "from-file"
    assert api_key(argparse.Namespace(api_key="from-flag", api_key_file=None)) == "from-flag"


def test_serve_help_gives_each_flag_its_meaning_and_default(capsys):
    import dataclasses

    from braid.runtime.cli import main
    from braid.runtime.config import EngineConfig, RequestLimits

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for field in [*dataclasses.fields(EngineConfig), *dataclasses.fields(RequestLimits)]:
        flag = "--" + field.name.replace("_", "-")
        meaning = " ".join(field.metadata["help"].split())
        assert f"{meaning} (default: {field.default})" in text, flag
    assert "(default: 16777216)" in text and "BRAID_API_KEY" in text
