"""Work that costs in proportion to a request runs off the event loop and shares the engine: a
select of many choices is tokenized off the loop and holds its queue room until the engine has
ended it; large logprob listings are built off the loop. Each case runs while three normal
streams decode and /health is probed (hostile_cases.under_attack)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

import hostile_cases
import httpx
import pytest
from conftest import LiveServer, assert_no_kv_leak, async_wait_for, wait_idle
from hostile_cases import (
    VICTIM_TOKENS,
    LoopCpu,
    assert_loop_free,
    assert_refused,
    decoding_victims,
    probe_health,
    under_attack,
)

from braid.runtime import Engine
from braid.runtime.server.service import Service

# The engine both isolation test files attack.
engine = hostile_cases.engine


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
            victims = await decoding_victims(roomy_server.url, http)
            stop = asyncio.Event()
            health = asyncio.create_task(probe_health(roomy_server.url, http, stop))
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

    with LoopCpu(roomy_server) as cpu:
        asyncio.run(main())
    assert_loop_free(cpu)
    # It left mid-way: the victims and some of the select's requests finished.
    assert engine.stats()["requests_finished"] - finished < 3 + num_leaves
    wait_idle(engine)
    assert_no_kv_leak(engine)


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
        # The other routes and the stream build their listings with the same code (suite
        # time: under -m slow).
        pytest.param(
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
            marks=pytest.mark.slow,
        ),
        pytest.param(
            "/generate",
            {
                "text": LISTED_PROMPT,
                "return_logprob": True,
                "logprob_start_len": 0,
                "top_logprobs_num": 20,
                "return_text_in_logprobs": True,
                "sampling_params": {"max_new_tokens": 1, "n": 14} | SAMPLED,
            },
            marks=pytest.mark.slow,
        ),
        pytest.param(
            "/v1/completions",
            {"prompt": LISTED_PROMPT, "echo": True, "logprobs": 20, "max_tokens": 1, "n": 14}
            | SAMPLED
            | {"stream": True},
            marks=pytest.mark.slow,
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
