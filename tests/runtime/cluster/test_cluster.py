"""`braid serve --dp 2`: two engine replicas behind SGLang's router, braid's front before it,
all behind an API key. The replicas together compute what one engine computes on the same
requests (prefix affinity, read from the front's /server_info), with its answers; a replica
killed in the middle of a stream fails that stream with an error and is started again."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import httpx
import pytest
from conftest import ServeProcess, wait_for

from braid.runtime import Engine, SamplingParams

WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()
# Four documents of ~300 tokens that differ from their first word on.
PREFIXES = [
    f"Document {k}: " + " ".join(WORDS[(k * 5 + i * (k + 3)) % len(WORDS)] for i in range(150))
    for k in range(4)
]


def _prompts() -> list[str]:
    """32 requests, the four documents interleaved, as they would arrive from many users."""
    return [
        f"{PREFIXES[k]}\nQuestion {j}: what follows {WORDS[j]}?" for j in range(8) for k in range(4)
    ]


# The front and its replicas all require it (the router is given it too).
AUTH = {"Authorization": "Bearer test-key"}


@pytest.fixture(scope="module")
def front(tiny_model_path):
    with ServeProcess(tiny_model_path, "--dp", "2", "--api-key", "test-key") as front:
        yield front


def _info(front: ServeProcess) -> dict:
    reply = httpx.get(front.url + "/server_info", headers=AUTH, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_replicas_share_the_work_by_prefix(front, tiny_model_path):
    prompts = _prompts()

    async def send() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120, headers=AUTH) as http:
            body = {"sampling_params": {"max_new_tokens": 4, "temperature": 0}}
            return await asyncio.gather(
                *(http.post(front.url + "/generate", json={"text": p, **body}) for p in prompts)
            )

    replies = asyncio.run(send())
    assert [r.status_code for r in replies] == [200] * 32, [r.text for r in replies]
    replicas = _info(front)["replicas"]
    assert [(r["healthy"], r["restarts"]) for r in replicas] == [(True, 0), (True, 0)]
    assert all(r["requests_total"] > 0 for r in replicas)  # both served
    assert sum(r["requests_total"] for r in replicas) == 32

    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=4096)
    try:
        outs = engine.generate(prompts, SamplingParams(max_tokens=4, temperature=0))
        one_engine = engine.stats()["prefill_tokens_computed"]
        prefix_tokens = len(engine.encode(PREFIXES[0]))
    finally:
        engine.shutdown()
    assert 250 < prefix_tokens < 400
    computed = sum(r["prefill_tokens_computed"] for r in replicas)
    # Split by chance, each replica would compute most of the four documents: ~1.7x. The 32
    # arrive at once, before the router's tree holds a prefix, so the first requests of one
    # may still land on both replicas (1.0x to 1.2x seen).
    assert computed <= 1.35 * one_engine, (computed, one_engine)
    assert [r.json()["text"] for r in replies] == [o.text for o in outs]

    metrics = httpx.get(front.url + "/metrics", timeout=30).text
    for i in (0, 1):
        assert f'braid_prefill_tokens_computed_total{{replica="{i}"}}' in metrics
        assert f'braid_replica_up{{replica="{i}",url=' in metrics


def test_openai_routes_and_braid_only_fields_pass_the_front(front):
    prompt = PREFIXES[1] + "\nQuestion: and then?"
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0}
    completion = httpx.post(front.url + "/v1/completions", json=body, headers=AUTH, timeout=60)
    assert completion.status_code == 200, completion.text
    native = {"text": prompt, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    generated = httpx.post(front.url + "/generate", json=native, headers=AUTH, timeout=60).json()
    assert completion.json()["choices"][0]["text"] == generated["text"]
    # Fields SGLang's router would drop reach a replica all the same (the front sends them
    # itself): the stop regex cuts the output at its first digit.
    native["sampling_params"] |= {"max_new_tokens": 32, "stop_regex": "[0-9]", "ignore_eos": True}
    cut = httpx.post(front.url + "/generate", json=native, headers=AUTH, timeout=60)
    assert cut.status_code == 200, cut.text
    assert not any(c.isdigit() for c in cut.json()["text"])
    chat = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 6,
        "choices": ["yes", "no"],
    }
    answer = httpx.post(front.url + "/v1/chat/completions", json=chat, headers=AUTH, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] in ("yes", "no")
    assert httpx.post(front.url + "/generate", json=native, timeout=60).status_code == 401


def test_a_salt_keeps_its_prefixes_to_itself_across_the_replicas(front):
    """A chat completion salted s2 after two salted s1 reuses none of their prefix (the
    router dropped the salt from chat: s2 was served from s1's cache)."""
    chat = {"messages": [{"role": "user", "content": PREFIXES[2]}], "max_tokens": 2}

    def cached(salt: str) -> int:
        body = {**chat, "cache_salt": salt}
        r = httpx.post(front.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    cached("s1")
    assert cached("s1") > 250  # the affinity keeps a salt's requests together
    assert cached("s2") == 0


def test_a_stopped_replica_is_routed_around(front):
    """A replica stopped (SIGSTOP: it holds its connections and answers nothing): the stream
    it was serving ends with an error once its health checks fail, and requests sent
    meanwhile, through the router or the front's own routing, are answered by the other,
    not held until it runs again."""
    body = {
        "text": "Count: one two three four",
        # A stop regex: the front routes it itself (the router would drop the field).
        "sampling_params": {"max_new_tokens": 500, "ignore_eos": True, "stop_regex": "#{9}"},
        "stream": True,
    }
    with httpx.stream(
        "POST", front.url + "/generate", json=body, headers=AUTH, timeout=60
    ) as reply:
        assert reply.status_code == 200, reply.read()
        lines = reply.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        [victim] = [r for r in _info(front)["replicas"] if r["running_requests"]]
        os.kill(victim["pid"], signal.SIGSTOP)
        try:
            events = [line[5:].strip() for line in lines if line.startswith("data:")]
            assert events[-1] == "[DONE]"
            error = json.loads(events[-2])["error"]
            assert "stopped answering its health checks" in error["message"], error
            for i in range(4):
                plain = {"text": f"{PREFIXES[i]}\nStill?", "sampling_params": {"max_new_tokens": 2}}
                own = {**plain, "sampling_params": {"max_new_tokens": 2, "stop_regex": "#{9}"}}
                for sent in (plain, own):
                    r = httpx.post(front.url + "/generate", json=sent, headers=AUTH, timeout=30)
                    assert r.status_code == 200, r.text
            assert httpx.get(front.url + "/health", timeout=10).json() == {
                "replicas": 2,
                "replicas_healthy": 1,
            }
        finally:
            os.kill(victim["pid"], signal.SIGCONT)
    wait_for(lambda: all(_info(front)["replicas"][i]["healthy"] for i in (0, 1)), 60, "both")


@pytest.mark.slow  # suite time; the front's routing is tested above
def test_a_replica_that_dies_fails_its_stream_and_is_started_again(front):
    body = {
        "text": "Count: one two three",
        "sampling_params": {"max_new_tokens": 500, "ignore_eos": True, "temperature": 0},
        "stream": True,
    }
    with httpx.stream(
        "POST", front.url + "/generate", json=body, headers=AUTH, timeout=60
    ) as reply:
        lines = reply.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        [victim] = [r for r in _info(front)["replicas"] if r["running_requests"]]
        os.kill(victim["pid"], signal.SIGKILL)
        events = [line[5:].strip() for line in lines if line.startswith("data:")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert "failed in the middle of this stream" in error["message"], error

    # Requests go on meanwhile (the router retries them past the dead replica)...
    for i in range(4):
        plain = {"text": f"{PREFIXES[i]}\nAgain?", "sampling_params": {"max_new_tokens": 2}}
        reply = httpx.post(front.url + "/generate", json=plain, headers=AUTH, timeout=60)
        assert reply.status_code == 200, reply.text

    # ... and the dead one is started again.
    def back() -> bool:
        replica = _info(front)["replicas"][victim["index"]]
        return replica["restarts"] == 1 and replica["healthy"]

    wait_for(back, 120, "the replica to be started again")


def test_bad_scale_out_flags_are_refused(capsys):
    from braid.runtime.cli.main import main

    assert main(["serve", "--dp", "0"]) == 2
    assert "--dp must be >= 1, or 0 with at least one --worker-url" in capsys.readouterr().err
