"""The HTTP server on loopback: the official openai client against the OpenAI routes, raw
HTTP against the SGLang-compatible ones, checked against the engine run directly."""

from __future__ import annotations

import json
import re
import socket
import threading

import httpx
import jsonschema
import openai
import pytest
from conftest import LiveServer, StepGate, assert_no_kv_leak, wait_for, wait_idle

from braid.runtime import Engine, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12)


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


# ---- OpenAI routes, through the openai client ------------------------------------------------


def test_models(client):
    [model] = client.models.list().data
    assert model.id == "tiny"


def test_completion_is_the_engines_greedy_text(engine, client):
    out = client.completions.create(model="tiny", prompt="Once upon", max_tokens=12, temperature=0)
    direct = engine.generate("Once upon", GREEDY)
    assert out.choices[0].text == direct.text
    assert out.choices[0].finish_reason == direct.finish_reason
    assert out.usage.prompt_tokens == len(engine.encode("Once upon"))
    assert out.usage.completion_tokens == len(direct.token_ids)
    # The same prompt again: its tokens come from the prefix cache.
    again = client.completions.create(model="tiny", prompt="Once upon", max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_chat_sync_and_streaming_agree_with_the_engine(engine, client):
    messages = [{"role": "user", "content": "Tell me a story."}]
    out = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=12, temperature=0, stop=["zzz"]
    )
    prompt = engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    direct = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=12, stop=["zzz"]))
    assert out.choices[0].message.content == direct.text
    assert out.choices[0].message.role == "assistant"

    stream = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len(pieces) > 1 and "".join(pieces) == direct.text
    assert chunks[-1].usage.completion_tokens == len(direct.token_ids)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == direct.finish_reason


def test_chat_stream_opens_with_the_role_when_the_first_text_is_held_back(engine, client):
    messages = [{"role": "user", "content": "Tell me a story."}]
    first = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=1, temperature=0
    )
    # A stop string the first token starts but the next one does not finish: the engine
    # holds that token's text back, so its first chunk has no text.
    held = first.choices[0].message.content + "\x01\x02"
    stream = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=4, temperature=0, stop=[held], stream=True
    )
    chunks = [c for c in stream if c.choices]
    assert chunks[0].choices[0].delta.role == "assistant"


def test_completion_streaming(engine, client):
    stream = client.completions.create(
        model="tiny", prompt="Once upon", max_tokens=12, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream) == engine.generate("Once upon", GREEDY).text


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_response_format_json_schema_and_json_object(engine, client):
    out = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "A person, as JSON."}],
        max_tokens=60,
        seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
    )
    jsonschema.validate(json.loads(out.choices[0].message.content), PERSON)
    messages = [{"role": "user", "content": "Any JSON object."}]
    out = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=200,
        temperature=0,
        response_format={"type": "json_object"},
    )
    # The random model may not close its object within 200 tokens: the reply must then be
    # what the engine writes under an object schema.
    prompt = engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    params = SamplingParams(temperature=0, max_tokens=200, json_schema={"type": "object"})
    text = out.choices[0].message.content
    # Whitespace may open a document (the random model pads it).
    assert text.lstrip().startswith("{") and text == engine.generate(prompt, params).text
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_extra_constraints_n_seed_and_logprobs(client):
    seeded = dict(
        model="tiny",
        prompt="Code:",
        max_tokens=10,
        n=3,
        seed=7,
        extra_body={"regex": r"[A-Z]{3}-[0-9]{2}"},
    )
    out = client.completions.create(**seeded)
    assert len(out.choices) == 3
    assert all(re.fullmatch(r"[A-Z]{3}-[0-9]{2}", c.text) for c in out.choices)
    again = client.completions.create(**seeded)
    assert [c.text for c in again.choices] == [c.text for c in out.choices]
    out = client.completions.create(
        model="tiny", prompt="Pick:", max_tokens=5, extra_body={"choices": ["red", "green"]}
    )
    assert out.choices[0].text in ("red", "green")

    out = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hi"}],
        max_completion_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens == 4
    for entry in content:
        assert len(entry.top_logprobs) == 3
        # Greedy: the sampled token is the most likely one.
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)


def test_streamed_logprobs_come_with_each_chunk(client):
    """Each chunk carries its own tokens' logprobs, as OpenAI streams them (guidance's OpenAI
    backend rebuilds the text from them): chunk by chunk they are the whole reply's."""
    chat = dict(
        model="tiny",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=10,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    whole = client.chat.completions.create(**chat).choices[0]
    chunks = [c.choices[0] for c in client.chat.completions.create(**chat, stream=True)]
    with_tokens = [c for c in chunks if c.logprobs and c.logprobs.content]
    assert len(with_tokens) > 1  # not all at the end
    streamed = [entry for c in with_tokens for entry in c.logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [
        (e.token, e.logprob) for e in whole.logprobs.content
    ]
    assert all(len(e.top_logprobs) == 2 for e in streamed)
    assert "".join(e.token for e in streamed) == "".join(c.delta.content or "" for c in chunks)

    completion = dict(model="tiny", prompt="Once upon", max_tokens=10, temperature=0, logprobs=1)
    whole = client.completions.create(**completion).choices[0].logprobs
    chunks = [c.choices[0] for c in client.completions.create(**completion, stream=True)]
    listings = [c.logprobs for c in chunks if c.logprobs and c.logprobs.tokens]
    assert len(listings) > 1
    assert [t for x in listings for t in x.tokens] == whole.tokens
    assert [lp for x in listings for lp in x.token_logprobs] == whole.token_logprobs
    assert [o for x in listings for o in x.text_offset] == whole.text_offset


def test_echo_prompt_logprobs_match_transformers(engine, client, reference_logprobs):
    prompt = "The quick brown fox"
    out = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=0, echo=True, logprobs=0
    )
    listing = out.choices[0].logprobs
    ids = engine.encode(prompt)
    assert out.choices[0].text == prompt
    assert listing.token_logprobs[0] is None
    assert listing.token_logprobs[1:] == pytest.approx(reference_logprobs(ids, 1), abs=1e-4)
    assert "".join(listing.tokens) == prompt
    assert listing.text_offset[-1] == len(prompt) - len(listing.tokens[-1])


# ---- native routes, raw HTTP -----------------------------------------------------------------


def test_generate_single_batch_ids_and_logprobs(engine, server, reference_logprobs):
    url = server.url + "/generate"
    body = {"text": "Once upon", "sampling_params": {"max_new_tokens": 12, "temperature": 0}}
    out = httpx.post(url, json=body).json()
    direct = engine.generate("Once upon", GREEDY)
    assert out["text"] == direct.text and out["output_ids"] == direct.token_ids
    assert out["meta_info"]["finish_reason"]["type"] == direct.finish_reason
    assert out["meta_info"]["prompt_tokens"] == len(engine.encode("Once upon"))

    batch = httpx.post(url, json={**body, "text": ["Once upon", "Hello"]}).json()
    assert [o["text"] for o in batch] == [direct.text, engine.generate("Hello", GREEDY).text]
    by_ids = httpx.post(
        url,
        json={"input_ids": engine.encode("Once upon"), "sampling_params": body["sampling_params"]},
    ).json()
    assert by_ids["text"] == direct.text
    both = {"input_ids": [1, 2], **body}
    assert httpx.post(url, json=both).status_code == 400  # text or input_ids, not both

    ids = engine.encode("The quick brown fox jumps")
    out = httpx.post(
        url,
        json={
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": 2, "temperature": 0},
            "return_logprob": True,
            "logprob_start_len": 2,
            "top_logprobs_num": 2,
            "return_text_in_logprobs": True,
        },
    ).json()
    info = out["meta_info"]
    prompt_lps = [lp for lp, _, _ in info["input_token_logprobs"]]
    assert prompt_lps == pytest.approx(reference_logprobs(ids, 2), abs=1e-4)
    assert [t for _, t, _ in info["input_token_logprobs"]] == ids[2:]
    assert [t for _, t, _ in info["output_token_logprobs"]] == out["output_ids"]
    assert all(len(top) == 2 for top in info["output_top_logprobs"])


def test_generate_streams_the_text_so_far(engine, server):
    body = {
        "text": "Once upon",
        "sampling_params": {"max_new_tokens": 12, "temperature": 0},
        "stream": True,
    }
    events = []
    with httpx.stream("POST", server.url + "/generate", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                events.append(line[5:].strip())
    assert events[-1] == "[DONE]"
    texts = [json.loads(e)["text"] for e in events[:-1]]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))
    assert texts[-1] == engine.generate("Once upon", GREEDY).text
    assert json.loads(events[-2])["meta_info"]["finish_reason"]["type"] == "length"


def test_generate_with_a_regex(server):
    body = {
        "text": "Code:",
        "sampling_params": {"max_new_tokens": 10, "regex": r"[a-z]{2}[0-9]", "temperature": 0},
    }
    out = httpx.post(server.url + "/generate", json=body).json()
    assert re.fullmatch(r"[a-z]{2}[0-9]", out["text"])


def test_info_health_flush_and_metrics(engine, server):
    info = httpx.get(server.url + "/get_model_info").json()
    assert info["is_generation"] and info["chat_template"]["closing"]["user"]
    assert httpx.get(server.url + "/server_info").json()["max_kv_tokens"] == 4096
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/health_generate").status_code == 200
    assert httpx.post(server.url + "/flush_cache").status_code == 200
    wait_idle(engine)
    assert engine.stats()["kv_slots_cached"] == 0
    text = httpx.get(server.url + "/metrics").text
    for name in (
        "braid_num_requests_running",
        "braid_num_requests_waiting",
        "braid_kv_usage_ratio",
        "braid_prefix_cache_hit_ratio",
        "braid_decode_tokens_total",
        "braid_time_to_first_token_seconds_bucket",
        "braid_time_per_output_token_seconds_count",
    ):
        assert name in text


BAD_REQUESTS = [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (b'{"prompt": "\\ud800"}', "lone UTF-16 surrogate"),  # msgspec: "truncated"
    (b'{"prompt": "\\ud800x", "max_tokens": 1}', "surrogate"),
    (b'{"prompt": "a\\udc00"}', "invalid utf-16 surrogate pair"),
    (b'{"prompt": "a', "truncated"),
    (b'{"max_tokens": 3}', "missing required field `prompt`"),
    (b'{"prompt": 3}', "at `$.prompt`"),
    (b'{"prompt": "a", "max_tokens": "many"}', "at `$.max_tokens`"),
    (b'{"prompt": "a", "max_tokens": -1}', "max_tokens must be >= 0"),
    (b'{"prompt": "a", "temperature": -1}', "temperature"),
    (b'{"prompt": "a", "regex": "(unclosed"}', "regex"),
    (b'{"prompt": "a", "json_schema": {"type": "nonsense"}}', "nonsense"),
    (b'{"prompt": "a", "suffix": "z"}', "suffix is not implemented by braid"),
    (json.dumps({"prompt": "a " * 600}).encode(), "context"),
]


@pytest.mark.parametrize("body,message", BAD_REQUESTS)
def test_bad_requests_get_400_with_a_message(server, body, message):
    r = httpx.post(server.url + "/v1/completions", content=body)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"]


def test_generate_takes_sglang_frontend_sampling_params(engine, server):
    """The sampling_params SGLang's RuntimeEndpoint sends for a greedy gen: every field of its
    frontend, top_k=-1 for off and an empty stop_regex included."""
    frontend = {
        "max_new_tokens": 12,
        "min_new_tokens": 0,
        "n": 1,
        "stop": [],
        "stop_token_ids": [],
        "stop_regex": [],
        "temperature": 0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "ignore_eos": False,
        "regex": None,
        "json_schema": None,
    }
    url = server.url + "/generate"
    out = httpx.post(url, json={"text": "Once upon", "sampling_params": frontend})
    assert out.status_code == 200, out.text
    full = engine.generate("Once upon", GREEDY).text
    assert out.json()["text"] == full
    assert len(full) >= 6, f"unhelpful output for this test: {full!r}"
    pattern = re.escape(full[4:6])
    stopped = {"text": "Once upon", "sampling_params": {**frontend, "stop_regex": [pattern]}}
    out = httpx.post(url, json=stopped)
    assert out.status_code == 200, out.text
    assert out.json()["text"] == full[: re.search(pattern, full).start()]
    bad = {"text": "a", "sampling_params": {**frontend, "stop_regex": ["(a)\\1"]}}
    r = httpx.post(url, json=bad)
    assert r.status_code == 400 and "stop_regex" in r.json()["error"]["message"], r.text


def test_bad_requests_on_the_native_and_chat_routes(server, client):
    bad = [
        {"text": "a", "sampling_params": {"max_new_tokens": -1}},
        {"text": "a", "sampling_params": {"nonsense": 1}},
        {"text": "a", "sampling_params": {"json_schema": "{not json"}},
        {"text": "a", "sampling_params": {"tool_calls": {"tools": [], "parallel": True}}},
        {"sampling_params": {}},
    ]
    for body in bad:
        assert httpx.post(server.url + "/generate", json=body).status_code == 400, body
    with pytest.raises(openai.BadRequestError, match="regex"):
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "x"}],
            stream=True,
            extra_body={"regex": "(("},
        )


def test_api_key(engine):
    server = LiveServer(engine, api_key="sekret")
    try:
        assert httpx.get(server.url + "/v1/models").status_code == 401
        assert httpx.get(server.url + "/health").status_code == 200
        good = openai.OpenAI(base_url=server.url + "/v1", api_key="sekret", max_retries=0)
        assert good.models.list().data[0].id == "tiny"
        bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
    finally:
        server.stop()


def test_a_client_that_leaves_aborts_its_request(engine, server, monkeypatch):
    """Non-streaming: the server notices the closed connection while the engine works (its
    step held at a gate until the server has aborted the request)."""
    left = threading.Event()
    abort = engine.abort

    def abort_and_tell(rid: int) -> None:
        abort(rid)
        left.set()

    monkeypatch.setattr(engine, "abort", abort_and_tell)
    before = engine.stats()["requests_aborted"]
    body = json.dumps({"prompt": "Once upon", "max_tokens": 400, "ignore_eos": True}).encode()
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    port = int(server.url.rpartition(":")[2])
    with StepGate(engine, monkeypatch) as gate:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(head.encode() + body)
            assert gate.waiting.wait(60), "the request never reached the engine"
        # The client has left, its request's first step still waiting.
        assert left.wait(60), "the server did not abort the request of a client that left"
    wait_idle(engine)
    assert engine.stats()["requests_aborted"] == before + 1
    assert_no_kv_leak(engine)


def test_queue_limit_answers_503(tiny_model_path, monkeypatch):
    engine = Engine(
        model=str(tiny_model_path),
        device="cpu",
        dtype="float32",
        max_kv_tokens=2048,
        max_running_requests=2,
    )
    gate = StepGate(engine, monkeypatch)  # the two held requests stay in flight until it opens
    server = LiveServer(engine, max_queued_requests=0)  # room for 2 sequences
    svc = server.server.config.app.state.service
    try:
        body = {"prompt": "Once upon", "max_tokens": 8, "ignore_eos": True, "stream": True}
        events: list[list[str]] = [[], []]

        def hold(i: int) -> None:
            with httpx.stream("POST", server.url + "/v1/completions", json=body) as r:
                events[i] = [line for line in r.iter_lines() if line.startswith("data:")]

        threads = [threading.Thread(target=hold, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        wait_for(lambda: svc.num_active == 2, 60, "both held requests to be admitted")
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert r.status_code == 503 and "queue limit" in r.json()["error"]["message"]
        assert r.headers["retry-after"] == "1"  # the SDKs wait that long before retrying
        r = httpx.post(server.url + "/generate", json={"text": "x", "sampling_params": {"n": 3}})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
        ask = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
        r = httpx.post(server.url + "/v1/messages", json=ask)
        assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"
        assert r.headers["retry-after"] == "1"
        gate.open()
        for t in threads:
            t.join(60)
        assert all(e and e[-1] == "data: [DONE]" for e in events), events  # whole, once let go
        wait_idle(engine)
        assert_no_kv_leak(engine)
        ok = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert ok.status_code == 200
    finally:
        gate.open()
        server.stop()
        engine.shutdown()
