"""The prefix cache must not leak prompts across clients: a request's cached token count (and
timing) would tell its client whether its prompt starts like one another client sent, so a
secret could be guessed a token at a time. Requests share cached prefixes only under one
cache_salt, and under `--cache-scope key` only within one API key.

Each attack is run twice on a cache holding the victim's prompt alone: once with the right
guess, once with a wrong one. The control cases show that, where sharing is allowed, the
right guess reports one more cached token; across salts and keys the two must be equal.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading

import anthropic
import httpx
import openai
import pytest
from conftest import LiveServer, ServeProcess, assert_no_kv_leak, hold_engine, wait_idle

from braid.interpreter import RemoteBackend
from braid.runtime import Engine, SamplingParams
from braid.runtime.server import create_app

SECRET = "The PIN is 482913. Say it"
# The first digit guessed: the right guess shares one more token with SECRET than the wrong.
RIGHT, WRONG = "The PIN is 4 x", "The PIN is 5 x"
KEYS = ["key-a", "key-b"]


@pytest.fixture(autouse=True)
def no_kv_leak(engine):
    yield
    wait_idle(engine)
    assert_no_kv_leak(engine)


def guesses(engine, send, victim: dict, attacker: dict) -> tuple[int, int]:
    """What `send(prompt, **who)` reports as cached for the attacker's right and wrong guess,
    each sent when the cache holds the victim's prompt alone."""
    seen = []
    for guess in (RIGHT, WRONG):
        engine.flush_cache()
        send(SECRET, **victim)
        seen.append(send(guess, **attacker))
    return seen[0], seen[1]


def auth(key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"} if key else {}


def completion(url: str, prompt: str, salt: str | None = None, key: str | None = None) -> int:
    body = {"prompt": prompt, "max_tokens": 1}
    if salt is not None:
        body["cache_salt"] = salt
    r = httpx.post(url + "/v1/completions", json=body, headers=auth(key), timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


# ---- the attack, and the salt that stops it -------------------------------------------------

SHARING = [({}, {}), ({"salt": "a"}, {"salt": "a"})]
ISOLATED = [
    ({"salt": "a"}, {"salt": "b"}),
    ({"salt": "a"}, {}),
    ({}, {"salt": "b"}),
]


@pytest.mark.parametrize("victim,attacker", SHARING)
def test_within_one_salt_a_right_guess_shows_in_cached_tokens(engine, server, victim, attacker):
    right, wrong = guesses(engine, lambda p, **w: completion(server.url, p, **w), victim, attacker)
    assert right == wrong + 1 and wrong > 0


@pytest.mark.parametrize("victim,attacker", ISOLATED)
def test_across_salts_cached_tokens_do_not_depend_on_the_guess(engine, server, victim, attacker):
    right, wrong = guesses(engine, lambda p, **w: completion(server.url, p, **w), victim, attacker)
    assert right == wrong == 0


def test_an_empty_salt_is_refused(server):
    for path, body in [
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 1, "cache_salt": ""}),
        ("/generate", {"text": "Hi", "cache_salt": ""}),
    ]:
        r = httpx.post(server.url + path, json=body)
        assert r.status_code == 400 and "length >= 1 - at `$.cache_salt`" in r.text, r.text


@pytest.mark.parametrize("stream", [False, True])
def test_the_openai_client_salts_chat_through_extra_body(engine, server, stream):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)

    def chat(prompt: str, salt: str) -> int:
        messages = [{"role": "user", "content": prompt}]
        extra = {"extra_body": {"cache_salt": salt}, "max_tokens": 1}
        if not stream:
            reply = client.chat.completions.create(model="tiny", messages=messages, **extra)
            return reply.usage.prompt_tokens_details.cached_tokens
        chunks = client.chat.completions.create(
            model="tiny",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            **extra,
        )
        return [c for c in chunks if c.usage is not None][
            -1
        ].usage.prompt_tokens_details.cached_tokens

    right, wrong = guesses(engine, chat, {"salt": "a"}, {"salt": "a"})
    assert right == wrong + 1
    right, wrong = guesses(engine, chat, {"salt": "a"}, {"salt": "b"})
    assert right == wrong == 0


def test_generate_takes_a_salt(engine, server):
    def generate(prompt: str, salt: str) -> int:
        body = {"text": prompt, "sampling_params": {"max_new_tokens": 1}, "cache_salt": salt}
        r = httpx.post(server.url + "/generate", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["meta_info"]["cached_tokens"]

    right, wrong = guesses(engine, generate, {"salt": "a"}, {"salt": "a"})
    assert right == wrong + 1
    right, wrong = guesses(engine, generate, {"salt": "a"}, {"salt": "b"})
    assert right == wrong == 0


def test_anthropic_messages_take_a_salt(engine, server):
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)

    def message(prompt: str, salt: str) -> int:
        messages = [{"role": "user", "content": prompt}]
        with client.messages.stream(
            model="tiny", max_tokens=1, messages=messages, extra_body={"cache_salt": salt}
        ) as events:
            return events.get_final_message().usage.cache_read_input_tokens

    right, wrong = guesses(engine, message, {"salt": "a"}, {"salt": "a"})
    assert right == wrong + 1
    right, wrong = guesses(engine, message, {"salt": "a"}, {"salt": "b"})
    assert right == wrong == 0


def test_responses_take_a_salt(engine, server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)

    def respond(prompt: str, salt: str) -> int:
        reply = client.responses.create(
            model="tiny", input=prompt, max_output_tokens=1, extra_body={"cache_salt": salt}
        )
        return reply.usage.input_tokens_details.cached_tokens

    right, wrong = guesses(engine, respond, {"salt": "a"}, {"salt": "a"})
    assert right == wrong + 1
    right, wrong = guesses(engine, respond, {"salt": "a"}, {"salt": "b"})
    assert right == wrong == 0


def test_the_remote_backend_salts_its_gens_and_scores(engine, server):
    """A program's gens go to /generate and its selects to /braid/score (which reports no
    cached counts: the engine's own count of cached prompt tokens is read instead)."""
    backends = {salt: RemoteBackend(server.url, cache_salt=salt) for salt in ("a", "b")}
    one_token = SamplingParams(max_tokens=1)

    def gen(prompt: str, salt: str) -> int:
        out = asyncio.run(backends[salt].generate(prompt, one_token, lambda text: None))
        return out.meta["cached_tokens"]

    def score(prompt: str, salt: str) -> int:
        before = engine.stats()["cached_tokens"]
        asyncio.run(backends[salt].score(prompt, [" yes", " no"]))
        return engine.stats()["cached_tokens"] - before

    for send in (gen, score):
        right, wrong = guesses(engine, send, {"salt": "a"}, {"salt": "a"})
        assert right > wrong, send
        right, wrong = guesses(engine, send, {"salt": "a"}, {"salt": "b"})
        assert right == wrong, send


# ---- the engine: salted requests, trees, waiting and eviction ---------------------------------


def test_engine_requests_share_only_under_one_salt(engine):
    params = SamplingParams(max_tokens=1)
    prompt = "A long shared instruction, then a question"
    engine.flush_cache()
    engine.generate(prompt, params, cache_salt="a")
    assert engine.generate(prompt, params, cache_salt="a").meta["cached_tokens"] > 0
    assert engine.generate(prompt, params, cache_salt="b").meta["cached_tokens"] == 0
    assert engine.generate(prompt, params).meta["cached_tokens"] == 0


def test_branches_share_their_prefix_under_their_salt_only(engine):
    rng = random.Random(0)
    prefix = [rng.randrange(100, 40000) for _ in range(60)]
    branches = [[rng.randrange(100, 40000) for _ in range(5)] for _ in range(3)]
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    engine.flush_cache()
    engine.generate(prefix + [7], params, cache_salt="a")
    before = engine.stats()["prefill_tokens_computed"]
    engine.generate([prefix + b for b in branches], params, cache_salt="b")
    computed = engine.stats()["prefill_tokens_computed"] - before
    # The prefix once (not taken from salt a's), then each branch's own tokens.
    assert computed == len(prefix) + sum(len(b) for b in branches)


def test_a_request_waits_for_a_shared_prefill_only_under_its_own_salt(tiny_model_path):
    """A waiting request whose prompt another request is prefilling waits for that prefill
    to reach the cache (MIN_SHARED_TOKENS). Across salts it could not use it, and its delay
    would tell its client that the prompts match."""
    engine = Engine(
        model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=2048, chunk_size=32
    )
    steps: list[set[int]] = []  # the ids of the requests in each step's batch
    run = engine.runner.run

    def recording_run(batch):
        steps.append({r.rid for r in batch.requests})
        return run(batch)

    engine.runner.run = recording_run
    prompt = [random.Random(1).randrange(100, 40000) for _ in range(200)]  # 7 chunks
    params = SamplingParams(max_tokens=2, ignore_eos=True)

    def first_steps(salt_a: str, salt_b: str) -> list[int]:
        """The first step of a request under salt_a and of one under salt_b, both with the
        same prompt and queued at once."""
        engine.flush_cache()
        release = hold_engine(engine)
        done = [threading.Event(), threading.Event()]
        rids = [
            engine.submit(prompt, params, lambda c, d=d: c.finish_reason and d.set(), cache_salt=s)
            for s, d in zip((salt_a, salt_b), done, strict=True)
        ]
        steps.clear()
        release.set()
        assert all(d.wait(60) for d in done)
        return [next(i for i, step in enumerate(steps) if rid in step) for rid in rids]

    try:
        a, b = first_steps("a", "a")
        assert b > a  # it waited for the first one's prefill, then used it
        assert first_steps("a", "b") == [0, 0]  # prefilled side by side
        wait_idle(engine)
        assert_no_kv_leak(engine)
    finally:
        engine.shutdown()


def test_eviction_over_many_salts_keeps_outputs_and_accounting(tiny_model_path):
    """A pool too small for every salt's prompts: LRU eviction runs across namespaces, each
    salt's later prompts find its first one's prefix while the same prefix cached under the
    salt before is never found, outputs equal a cache-less run's, and no namespace outlives
    its tokens."""
    rng = random.Random(2)
    prefix = [rng.randrange(100, 40000) for _ in range(40)]
    prompts = [prefix + [rng.randrange(100, 40000) for _ in range(8)] for _ in range(24)]
    salts = [f"s{i // 3}" for i in range(len(prompts))]  # three prompts each, one after another
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    solo = Engine(
        model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=4096,
        prefix_cache=False,
    )  # fmt: skip
    engine = Engine(model=str(tiny_model_path), device="cpu", dtype="float32", max_kv_tokens=300)
    try:
        expected = [solo.generate(p, params).token_ids for p in prompts]
        outs = [
            engine.generate(p, params, cache_salt=s) for p, s in zip(prompts, salts, strict=True)
        ]
        assert [o.token_ids for o in outs] == expected
        cached = [o.meta["cached_tokens"] for o in outs]
        assert cached[::3] == [0] * 8
        assert all(c >= len(prefix) for i, c in enumerate(cached) if i % 3)
        assert engine.stats()["evicted_tokens"] > 0
        assert_no_kv_leak(engine)
        engine.flush_cache()
        assert engine.stats()["kv_slots_free"] == engine.stats()["kv_slots_total"]
        assert not engine.cache._roots
    finally:
        solo.shutdown()
        engine.shutdown()


# ---- --cache-scope key ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed(engine):
    """A server over the module's engine where each of KEYS is a tenant of its own."""
    server = LiveServer(engine, api_key=KEYS, cache_scope="key")
    yield server
    server.stop()


def test_each_key_shares_its_own_prefixes_only(engine, keyed):
    def send(prompt: str, **who) -> int:
        return completion(keyed.url, prompt, **who)

    right, wrong = guesses(engine, send, {"key": "key-a"}, {"key": "key-a"})
    assert right == wrong + 1
    right, wrong = guesses(
        engine, send, {"key": "key-a", "salt": "s"}, {"key": "key-a", "salt": "s"}
    )
    assert right == wrong + 1
    for attacker in ({"key": "key-b"}, {"key": "key-b", "salt": "s"}):
        right, wrong = guesses(engine, send, {"key": "key-a", "salt": "s"}, attacker)
        assert right == wrong == 0, attacker
    # Under a key, the request's own salt still separates.
    right, wrong = guesses(engine, send, {"key": "key-a"}, {"key": "key-a", "salt": "s"})
    assert right == wrong == 0


def test_every_key_is_accepted_in_both_headers_and_others_refused(keyed):
    body = {"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}
    for key in KEYS:
        r = httpx.post(keyed.url + "/v1/messages", json=body, headers={"x-api-key": key})
        assert r.status_code == 200, r.text
        assert httpx.get(keyed.url + "/v1/models", headers=auth(key)).status_code == 200
    for headers in ({}, auth("key-c"), {"x-api-key": "key-"}):
        assert httpx.get(keyed.url + "/v1/models", headers=headers).status_code == 401


def test_a_stored_response_is_its_tenants_alone(keyed):
    """Another key can neither read a stored response, nor continue it (and so read its
    conversation), nor delete it: to it the id is not found."""
    clients = {
        key: openai.OpenAI(base_url=keyed.url + "/v1", api_key=key, max_retries=0) for key in KEYS
    }
    owner, other = clients[KEYS[0]], clients[KEYS[1]]
    made = owner.responses.create(model="tiny", input="Your bank PIN is 483.", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(made.id)
    with pytest.raises(openai.BadRequestError, match="not found"):
        other.responses.create(
            model="tiny", previous_response_id=made.id, input="What is my PIN?", max_output_tokens=2
        )
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(made.id)
    assert owner.responses.retrieve(made.id).id == made.id  # still there, for its own key
    follow = owner.responses.create(
        model="tiny", previous_response_id=made.id, input="And?", max_output_tokens=2
    )
    assert follow.previous_response_id == made.id
    owner.responses.delete(made.id)
    for client in clients.values():
        client.close()


def test_the_dashboard_lists_no_tenants_requests(keyed):
    """Under key scope the dashboard shows the engine's figures but not the last requests:
    one key's traced output text would be another's to read."""
    body = {"text": SECRET, "sampling_params": {"max_new_tokens": 4, "trace": True}}
    r = httpx.post(keyed.url + "/generate", json=body, headers=auth(KEYS[0]), timeout=60)
    assert r.status_code == 200, r.text
    data = httpx.get(keyed.url + "/dashboard/data", headers=auth(KEYS[1])).json()
    assert data["requests"] == [] and data["samples"]
    assert SECRET not in json.dumps(data)


def test_no_tenant_flushes_the_others_cache(engine, keyed):
    """Under --cache-scope key without an admin key, /flush_cache is refused to every key:
    one tenant would otherwise empty the others' cache (and time their prompts afresh)."""
    for key in KEYS:
        r = httpx.post(keyed.url + "/flush_cache", headers=auth(key))
        assert r.status_code == 403, r.text
        assert "--admin-api-key" in r.json()["error"]["message"]


def test_the_admin_key_alone_flushes(engine):
    server = LiveServer(engine, api_key=KEYS, cache_scope="key", admin_api_key="admin-k")
    try:
        completion(server.url, SECRET, key=KEYS[0])
        assert engine.stats()["kv_slots_cached"] > 0
        for key in (*KEYS, "wrong", None):
            headers = auth(key) if key else {}
            assert httpx.post(server.url + "/flush_cache", headers=headers).status_code == 403
        assert engine.stats()["kv_slots_cached"] > 0
        r = httpx.post(server.url + "/flush_cache", headers=auth("admin-k"))
        assert r.status_code == 200, r.text
        assert engine.stats()["kv_slots_cached"] == 0
        # The admin key is no tenant's: the other routes refuse it.
        body = {"prompt": "x", "max_tokens": 1}
        r = httpx.post(server.url + "/v1/completions", json=body, headers=auth("admin-k"))
        assert r.status_code == 401
    finally:
        server.stop()


def test_an_admin_key_alone_leaves_the_other_routes_open(engine):
    server = LiveServer(engine, admin_api_key="admin-k")
    try:
        completion(server.url, "Hello")  # a 200 without a key
        assert httpx.post(server.url + "/flush_cache").status_code == 403
        assert httpx.post(server.url + "/flush_cache", headers=auth("admin-k")).status_code == 200
    finally:
        server.stop()


def test_key_scope_needs_keys(engine):
    with pytest.raises(ValueError, match="API key"):
        create_app(engine, "tiny", cache_scope="key")
    with pytest.raises(ValueError, match="cache_scope"):
        create_app(engine, "tiny", api_key="k", cache_scope="tenant")


def test_serve_scopes_the_cache_by_the_keys_it_is_given(tiny_model_path):
    """`braid serve --api-key K --api-key K' --cache-scope key`, as users start it."""
    flags = ["--api-key", "key-a", "--api-key", "key-b", "--cache-scope", "key"]
    with ServeProcess(tiny_model_path, *flags, "--admin-api-key", "admin-k") as server:

        def send(prompt: str, key: str) -> int:
            return completion(server.url, prompt, key=key)

        def flushed_guesses(attacker: str) -> tuple[int, int]:
            seen = []
            for guess in (RIGHT, WRONG):
                r = httpx.post(server.url + "/flush_cache", headers=auth("admin-k"))
                assert r.status_code == 200
                send(SECRET, "key-a")
                seen.append(send(guess, attacker))
            return seen[0], seen[1]

        right, wrong = flushed_guesses("key-a")
        assert right == wrong + 1
        right, wrong = flushed_guesses("key-b")
        assert right == wrong == 0
