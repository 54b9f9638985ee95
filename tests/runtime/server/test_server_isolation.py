"""One hostile request must fail alone: each case runs while three normal streams decode, and
checks that they finish whole and that /health keeps answering within a second."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from conftest import (
    LiveServer,
    assert_no_kv_leak,
    async_wait_for,
    compile_taken,
    stream_events,
    wait_idle,
)

from braid import grammars
from braid.runtime import Engine, SamplingParams
from braid.runtime.output.processor import OutputProcessor
from braid.runtime.server.service import Service

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


# ---- a select (/braid/score) ------------------------------------------------------------------

# The reported select scaled to the tiny model's context: 1,024 short continuations of one
# prefix, each tokenized with it: 4.1 M characters (--max-score-chars allows 4,194,304).
SELECT = {
    "prefix": "Pick one: " + "#" * 4000,
    "continuations": [f" choice {i}" for i in range(1024)],
}


@pytest.fixture(scope="module")
def roomy_server(engine):
    """The module's engine behind a queue that holds a select of 1,024 continuations (the
    default --max-choices) beside the streams."""
    server = LiveServer(engine, max_queued_requests=1100, max_request_bytes=1_000_000)
    yield server
    server.stop()


def _select_leaves(engine: Engine) -> int:
    """The select's requests in the engine: the only ones asking for no tokens."""
    return sum(r.params.max_tokens == 0 for r in tuple(engine.scheduler.live.values()))


@contextlib.contextmanager
def _most_select_leaves(engine: Engine) -> Iterator[list[int]]:
    """The most select requests the engine held at once while the block ran ([count])."""
    most, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            most[0] = max(most[0], _select_leaves(engine))
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield most
    finally:
        stop.set()
        watcher.join()


def test_a_select_of_many_choices_is_tokenized_off_the_loop_and_shares_the_engine(
    engine, roomy_server
):
    """Tokenized on the event loop, this select held /health for seconds; submitted at once,
    its 1,024 leaves queued ahead of every other request."""
    with _most_select_leaves(engine) as most:
        r = under_attack(roomy_server, "/braid/score", json=SELECT)
    assert r.status_code == 200, r.text
    logprobs = r.json()["logprobs"]
    assert len(logprobs) == 1024 and all(lps and max(lps) <= 0 for lps in logprobs)
    # The first leaf alone (it computes the prefix), then a quarter of the running slots.
    assert 1 <= most[0] <= engine.config.max_running_requests // 4
    # Every continuation departs from the prefix at the same token, so a select of a few of
    # them is aligned alike.
    some = asyncio.run(engine.ascore(SELECT["prefix"], SELECT["continuations"][:3]))
    for got, expected in zip(logprobs, some, strict=False):
        assert got == pytest.approx(expected, abs=1e-4)
    wait_idle(engine)
    assert_no_kv_leak(engine)


def test_a_select_whose_client_left_holds_its_room_until_the_engine_has_ended_it(
    engine, roomy_server, monkeypatch
):
    """The queue limit counts a select's continuations until the engine has ended the last
    of them: the count fell to 0 at the disconnect while the engine still held 1,025
    requests."""
    svc = roomy_server.server.config.app.state.service
    num_leaves = len(SELECT["continuations"])
    finished = engine.stats()["requests_finished"]
    run = engine.runner.run

    def slow_step(batch):  # leaves stay in the engine a while after the client leaves
        time.sleep(0.02)
        return run(batch)

    monkeypatch.setattr(engine.runner, "run", slow_step)

    async def main() -> None:
        async with httpx.AsyncClient(timeout=120) as http:
            victims = await _decoding_victims(roomy_server.url, http)
            stop = asyncio.Event()
            health = asyncio.create_task(_health(roomy_server.url, http, stop))
            leaving = httpx.AsyncClient(timeout=120)
            select = asyncio.create_task(
                leaving.post(roomy_server.url + "/braid/score", json=SELECT)
            )
            # Past its first leaf (which runs alone): several in the engine.
            await async_wait_for(lambda: _select_leaves(engine) > 1, 60, "the select to run")
            select.cancel()  # the client leaves: its connection closes
            with contextlib.suppress(asyncio.CancelledError):
                await select
            await leaving.aclose()
            # The queue's count read first: if the engine still holds one of the select's
            # requests after that, the count must have included the select.
            while True:
                held = svc.num_active
                leaves = _select_leaves(engine)
                assert held >= num_leaves or leaves == 0, (held, leaves)
                if held < num_leaves:
                    break
                await asyncio.sleep(0.001)
            finals = await asyncio.gather(*victims)
            stop.set()
            assert await health > 0
        for final in finals:
            assert final["usage"]["completion_tokens"] == VICTIM_TOKENS, final

    asyncio.run(main())
    # It left mid-way: the victims and some of the select's requests finished.
    assert engine.stats()["requests_finished"] - finished < 3 + num_leaves
    wait_idle(engine)
    assert_no_kv_leak(engine)


def test_a_select_past_the_prompt_bound_is_refused_before_it_is_tokenized(server):
    """Each continuation is a prompt with the prefix: 4 of a 900 KB prefix blocked the loop."""
    body = {"prefix": "y" * 900_000, "continuations": ["a", "b", "c", "d"]}
    r = under_attack(server, "/braid/score", json=body)
    assert_refused(r, 400, "prefix + continuation has 900001 characters", "context of 512")


def test_the_reported_select_is_refused_before_it_is_tokenized(roomy_server):
    """A 6,000-word prefix and 1,024 continuations: 31 MB to tokenize, 25 s on the loop."""
    body = {"prefix": "word " * 6000, "continuations": SELECT["continuations"]}
    r = under_attack(roomy_server, "/braid/score", json=body)
    assert_refused(r, 400, "characters to tokenize", "(--max-score-chars)")


# ---- logprob listings -------------------------------------------------------------------------

# Each token with its 20 alternatives, each one's text decoded: ~130,000 entries in each case
# (32 samples of 200 tokens held the loop 1.1 s); the prompt's listings cost one step.
LISTED_PROMPT = "Listed:" + " word" * 480
SAMPLED = {"temperature": 1, "seed": 1}


@pytest.mark.parametrize(
    "path, body",
    [
        (
            "/v1/completions",
            {"prompt": LISTED_PROMPT, "echo": True, "logprobs": 20, "max_tokens": 1, "n": 14}
            | SAMPLED,
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "Listed"}],
                "logprobs": True,
                "top_logprobs": 20,
                "max_tokens": 440,
                "ignore_eos": True,
                "n": 13,
            }
            | SAMPLED,
        ),
        (
            "/generate",
            {
                "text": LISTED_PROMPT,
                "return_logprob": True,
                "logprob_start_len": 0,
                "top_logprobs_num": 20,
                "return_text_in_logprobs": True,
                "sampling_params": {"max_new_tokens": 1, "n": 14} | SAMPLED,
            },
        ),
        (
            "/v1/completions",
            {"prompt": LISTED_PROMPT, "echo": True, "logprobs": 20, "max_tokens": 1, "n": 14}
            | SAMPLED
            | {"stream": True},
        ),
    ],
    ids=["completions", "chat", "generate", "completions streamed"],
)
def test_a_large_logprob_listing_is_built_off_the_loop(roomy_server, monkeypatch, path, body):
    """Each listing's texts are decoded off the event loop's thread (a stream's events too: one
    of them lists a whole prompt, which a long context makes seconds of work)."""
    on_loop = []
    token_texts = Service.token_texts

    def watched(self, ids: list[int]) -> list[str]:
        on_loop.append(threading.current_thread() is roomy_server.thread)
        return token_texts(self, ids)

    monkeypatch.setattr(Service, "token_texts", watched)
    r = under_attack(roomy_server, path, json=body)
    assert r.status_code == 200, r.text[:500]
    assert len(r.content) > 3_000_000  # the listings are there
    assert on_loop and not any(on_loop)


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
