"""The answers /openapi.json declares (runtime/server/openapi_responses.py) against the server's
real ones: every operation declares its 200 and the errors it can answer; requests of every
kind, streamed or not (on the tiny model, and on scripted models that think and call tools),
get 200s whose bodies, each event of a stream, the document describes; the errors of each
status come in the declared shape; and answers that stray from the document fail the checks
the HTTP fuzz runs (Schemathesis' not_a_server_error, status_code_conformance,
content_type_conformance and response_schema_conformance)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading

import httpx
import pytest
import reasoning_cases
import requests
import schemathesis
import transformers
from conftest import LiveServer, hold_engine, wait_for
from reasoning_cases import WEATHER
from reasoning_models import QUESTION
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.failures import FailureGroup
from schemathesis.core.transport import Response
from starlette.routing import Route

from braid.runtime import Engine
from braid.runtime.config import EngineConfig
from braid.runtime.server import openapi, openapi_responses
from braid.runtime.server.openapi_bodies import Body
from braid.runtime.server.routes import openai as openai_routes

served = reasoning_cases.served

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
RETRIED_CHECKS = CHECKS[1:]  # not_a_server_error fails a 503, declared or not
OPEN_PATHS = {"/health", "/metrics"}  # no API key needed (app.py)
KEY, ADMIN = "user-key", "admin-key"
CHAT = [{"role": "user", "content": "Hello"}]
SHORT = dict(max_tokens=4, temperature=0)


@pytest.fixture(scope="module")
def live(engine):
    """A server with every route (the LoRA ones too)."""
    server = LiveServer(engine, lora_updates=True)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def guarded(engine):
    """A server that checks keys, the Host and body sizes."""
    server = LiveServer(
        engine,
        api_key=KEY,
        admin_api_key=ADMIN,
        max_request_bytes=4096,
        allowed_hosts=frozenset({"127.0.0.1"}),
        lora_updates=True,
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def doc(live) -> dict:
    return httpx.get(live.url + "/openapi.json").json()


@pytest.fixture(scope="module")
def api(doc):
    return schemathesis.openapi.from_dict(doc)


def ask(server, api, method: str, path: str, body=None, params=None, checks=CHECKS, **kw):
    """Send a request to `path`'s operation (its path parameters `params`) and check the
    answer as the fuzz does: a failure raises."""
    params = params or {}
    url = server.url + path.format(**params)
    response = httpx.request(method, url, json=body, timeout=120, **kw)
    case = api[path][method.upper()].Case(path_parameters=params)
    case.validate_response(response, checks=checks)
    return response


def operations(doc: dict):
    for path, methods in doc["paths"].items():
        for method, operation in methods.items():
            yield method, path, operation


# ---- the document ----------------------------------------------------------------------------


def test_every_operation_declares_its_answers(doc):
    """A 200 with a schema for each body, and the error statuses each operation can answer:
    the guard's 403 and a failure's 500 everywhere, 401 on the keyed routes, 400/413/415 where
    a body is read, 404 where a path names an object, 503 (Anthropic's 529) where a request
    streams from the engine; no `default`, which would switch status checks off."""
    seen = 0
    for method, path, operation in operations(doc):
        seen += 1
        where = f"{method.upper()} {path}"
        answers = operation["responses"]
        assert "default" not in answers and "200" in answers, where
        for media_type, content in answers["200"].get("content", {}).items():
            assert content.get("schema"), (where, media_type)
        statuses = {int(s) for s in answers if s != "200"}
        expected = {403, 500}
        if path not in OPEN_PATHS:
            expected.add(401)
        body = operation.get("requestBody", {}).get("content", {}).get("application/json")
        if body is not None:
            expected |= {400, 413, 415}
        if "{" in path:
            expected.add(404)
        if "text/event-stream" in answers["200"].get("content", {}):
            assert "stream" in body["schema"]["properties"], where
            expected.add(529 if path.startswith("/v1/messages") else 503)
        assert expected <= statuses, (where, expected - statuses)
        shape = "AnthropicError" if path.startswith("/v1/messages") else "Error"
        for status in statuses:
            schema = answers[str(status)]["content"]["application/json"]["schema"]
            assert schema == {"$ref": f"#/components/schemas/{shape}"}, (where, status)
    assert seen == len(openapi_responses.ANSWERS)  # none declared for a route that is gone


def test_streaming_operations_declare_their_events(doc):
    for _, path, operation in operations(doc):
        body = operation.get("requestBody", {}).get("content", {}).get("application/json")
        if body is not None and "stream" in body["schema"].get("properties", {}):
            assert "text/event-stream" in operation["responses"]["200"]["content"], path


def test_an_answer_named_as_another_schema_is_refused(monkeypatch):
    """Its reference would point at the other schema: the document is not built."""

    class ToolCall(Body):  # a request Struct's name (wire.ToolCall)
        id: int

    answers = openapi_responses.Answers({openapi_responses.JSON: ToolCall}, ())
    monkeypatch.setitem(openapi_responses.ANSWERS, ("get", "/v1/models"), answers)
    with pytest.raises(ValueError, match="share a name"):
        openapi.document(openai_routes.ROUTES)


def test_a_route_without_declared_answers_is_refused():
    async def new(request): ...

    with pytest.raises(KeyError, match="GET /new: declare its answers"):
        openapi.document([Route("/new", new, methods=["GET"])])


def test_a_config_answered_whole_requires_every_field(doc):
    """/server_info writes every EngineConfig field, defaulted or not: none may go missing."""
    required = doc["components"]["schemas"]["EngineConfig"]["required"]
    assert required == [f.name for f in dataclasses.fields(EngineConfig)]


# ---- real answers ----------------------------------------------------------------------------

SUCCESSES = [
    ("get", "/v1/models", None),
    ("post", "/v1/completions", {"prompt": "Hello", **SHORT}),
    (
        "post",
        "/v1/completions",
        {"prompt": ["Hello", "Hi"], "n": 2, "echo": True, "logprobs": 2, **SHORT},
    ),
    (
        "post",
        "/v1/completions",
        {"prompt": "Hi", "stream": True, "stream_options": {"include_usage": True}, **SHORT}
        | {"logprobs": 1, "echo": True},
    ),
    (
        "post",
        "/v1/chat/completions",
        {"messages": CHAT, "logprobs": True, "top_logprobs": 2, **SHORT},
    ),
    (
        "post",
        "/v1/chat/completions",
        {"messages": CHAT, "stream": True, "stream_options": {"include_usage": True}, **SHORT}
        | {"logprobs": True, "top_logprobs": 1, "n": 2},
    ),
    ("post", "/v1/responses", {"input": "Hello", "max_output_tokens": 4, "metadata": {"a": "b"}}),
    ("post", "/v1/responses", {"input": "Hello", "max_output_tokens": 4, "stream": True}),
    ("post", "/v1/messages", {"messages": CHAT, "max_tokens": 4}),
    ("post", "/v1/messages", {"messages": CHAT, "max_tokens": 4, "stream": True}),
    ("post", "/v1/messages/count_tokens", {"messages": CHAT}),
    ("post", "/v1/embeddings", {"input": ["Hello", "Hi"]}),
    ("post", "/v1/embeddings", {"input": [[1, 2, 3]], "encoding_format": "base64"}),
    ("post", "/tokenize", {"prompt": "Hello", "return_token_strs": True}),
    ("post", "/tokenize", {"messages": CHAT}),
    ("post", "/tokenize", {"content": "Hello"}),
    ("post", "/detokenize", {"tokens": [1, 2, 3]}),
    ("post", "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 4}}),
    (
        "post",
        "/generate",
        {"text": ["Hello", "Hi"], "sampling_params": {"max_new_tokens": 3, "trace": True}}
        | {"return_logprob": True, "top_logprobs_num": 2, "return_text_in_logprobs": True}
        | {"logprob_start_len": 0},
    ),
    (
        "post",
        "/generate",
        {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3, "n": 2}}
        | {"stream": True, "return_logprob": True, "top_logprobs_num": 1},
    ),
    ("post", "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 0}}),
    ("post", "/braid/score", {"prefix": "The sky is", "continuations": [" blue", " green"]}),
    ("post", "/braid/release", {"program_id": "p"}),
    ("post", "/braid/prepare", {"sampling_params": {"regex": "[ab]+"}}),
    ("get", "/get_model_info", None),
    ("get", "/model_info", None),
    ("get", "/server_info", None),
    ("get", "/get_server_info", None),
    ("get", "/health", None),
    ("get", "/health_generate", None),
    ("get", "/metrics", None),
    ("get", "/dashboard", None),
    ("get", "/dashboard/data", None),  # after the requests above: their summaries, traced ones
    ("get", "/openapi.json", None),
    ("get", "/flush_cache", None),
    ("post", "/flush_cache", None),
]


@pytest.mark.parametrize(("method", "path", "body"), SUCCESSES)
def test_answers_follow_the_document(live, api, method, path, body):
    response = ask(live, api, method, path, body)
    assert response.status_code == 200, response.text
    if body is not None and body.get("stream"):
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.text.count("\n\n") > 2  # events, each checked on its own


def test_a_model_card_and_a_stored_response_follow_the_document(live, api):
    assert ask(live, api, "get", "/v1/models/{model_id}", params={"model_id": "tiny"})
    created = ask(live, api, "post", "/v1/responses", {"input": "Hi", "max_output_tokens": 2})
    stored = {"response_id": created.json()["id"]}
    for method in ("get", "delete"):
        response = ask(live, api, method, "/v1/responses/{response_id}", params=stored)
        assert response.status_code == 200, response.text


def test_lora_answers_follow_the_document(live, api, tiny_model_path, tmp_path):
    peft = pytest.importorskip("peft")
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path)
    adapter = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["q_proj"]))
    adapter.save_pretrained(tmp_path)
    load = {"lora_name": "adapter", "lora_path": str(tmp_path)}
    assert ask(live, api, "post", "/load_lora_adapter", load).status_code == 200
    try:
        cards = ask(live, api, "get", "/v1/models").json()["data"]
        assert any(card.get("parent") == "tiny" for card in cards)  # the adapter's card
        card = {"model_id": "tiny:adapter"}
        assert ask(live, api, "get", "/v1/models/{model_id}", params=card).json()["parent"]
    finally:
        unload = {"lora_name": "adapter"}
        assert ask(live, api, "post", "/unload_lora_adapter", unload).status_code == 200


# A thought, then an answer or a call: reasoning fields, reasoning items, thinking blocks,
# tool calls whole and streamed.
ASKED, OUTPUT = {"max_tokens": 40}, {"max_output_tokens": 40}
FORECAST = {"type": "function", **WEATHER["function"]}  # the Responses API's form
CALLED = {"name": "weather", "input_schema": WEATHER["function"]["parameters"]}  # Anthropic's
THINKING = [
    # (script, path, body, what the answer shows, streamed or not)
    ("qwen3", "/v1/chat/completions", {"messages": QUESTION, **ASKED}, '"reasoning_content":"'),
    (
        "qwen3_tool",
        "/v1/chat/completions",
        {"messages": QUESTION, "tools": [WEATHER], **ASKED},
        '"tool_calls":[',
    ),
    (
        "qwen3_tool",
        "/v1/chat/completions",
        {"messages": QUESTION, "functions": [WEATHER["function"]], **ASKED}
        | {"function_call": {"name": "weather"}},
        '"function_call":{',
    ),
    ("qwen3", "/v1/responses", {"input": QUESTION, **OUTPUT}, '"type":"reasoning"'),
    (
        "qwen3_tool",
        "/v1/responses",
        {"input": QUESTION, "tools": [FORECAST], **OUTPUT},
        '"type":"function_call"',
    ),
    ("qwen3", "/v1/messages", {"messages": QUESTION, **ASKED}, '"type":"thinking"'),
    (
        "qwen3_tool",
        "/v1/messages",
        {"messages": QUESTION, "tools": [CALLED], **ASKED},
        '"type":"tool_use"',
    ),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("name", "path", "body", "shows"), THINKING)
def test_thoughts_and_calls_follow_the_document(served, name, path, body, shows, stream):
    s = served(name)
    api = schemathesis.openapi.from_url(s.url + "/openapi.json")
    response = ask(s.live, api, "post", path, {**body, "temperature": 0, "stream": stream})
    assert response.status_code == 200, response.text
    assert shows in response.text, response.text


# ---- errors ----------------------------------------------------------------------------------


def keyed(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


ERRORS = [
    # (status, method, path, body, headers): each answered in the shape declared
    (401, "post", "/v1/chat/completions", {"messages": CHAT}, {}),
    (401, "post", "/v1/messages", {"messages": CHAT, "max_tokens": 1}, {}),
    (401, "get", "/dashboard/data", None, keyed("wrong")),
    (403, "post", "/flush_cache", None, keyed()),  # the admin key's
    (403, "get", "/v1/models", None, {"Host": "elsewhere.example", **keyed()}),
    (403, "get", "/health", None, {"Origin": "https://elsewhere.example"}),
    (400, "post", "/v1/completions", {"prompt": 7}, keyed()),
    (400, "post", "/v1/messages", {"messages": CHAT}, keyed()),
    (400, "post", "/v1/responses", {"input": "Hi", "previous_response_id": "resp_0"}, keyed()),
    (400, "post", "/generate", {"text": "a", "input_ids": [1]}, keyed()),
    (400, "post", "/unload_lora_adapter", {"lora_name": "none"}, keyed(ADMIN)),
    (404, "post", "/v1/chat/completions", {"messages": CHAT, "model": "other"}, keyed()),
    (404, "post", "/v1/messages/count_tokens", {"messages": CHAT, "model": "other"}, keyed()),
    (404, "post", "/tokenize", {"prompt": "a", "model": "other"}, keyed()),
    (413, "post", "/v1/completions", {"prompt": "a" * 5000}, keyed()),
    (415, "post", "/v1/embeddings", None, {"Content-Type": "text/plain", **keyed()}),
]


@pytest.mark.parametrize(("status", "method", "path", "body", "headers"), ERRORS)
def test_errors_follow_the_document(guarded, api, status, method, path, body, headers):
    content = b"hello" if headers.get("Content-Type") == "text/plain" else None
    response = ask(guarded, api, method, path, body, headers=headers, content=content)
    assert response.status_code == status, response.text


@pytest.mark.parametrize(
    ("method", "path", "params"),
    [
        ("get", "/v1/models/{model_id}", {"model_id": "other"}),
        ("get", "/v1/responses/{response_id}", {"response_id": "resp_0"}),
        ("delete", "/v1/responses/{response_id}", {"response_id": "resp_0"}),
    ],
)
def test_an_unknown_object_is_a_404_as_declared(live, api, method, path, params):
    assert ask(live, api, method, path, params=params).status_code == 404


# Refusals made before /v1/messages runs (the guard's, the body limit's) answer in OpenAI's
# shape where the route declares (and its module promises) Anthropic's.
MESSAGES_REFUSALS = [
    (403, {"Host": "elsewhere.example", **keyed()}, {"messages": CHAT, "max_tokens": 1}),
    (413, keyed(), {"messages": [{"role": "user", "content": "a" * 5000}], "max_tokens": 1}),
    (415, {"Content-Type": "text/plain", **keyed()}, None),
]


@pytest.mark.parametrize(("status", "headers", "body"), MESSAGES_REFUSALS)
def test_refusals_on_messages_come_in_anthropics_shape(guarded, api, status, headers, body):
    content = b"hello" if body is None else None
    response = ask(guarded, api, "post", "/v1/messages", body, headers=headers, content=content)
    assert response.status_code == status


@pytest.fixture(scope="module")
def full(tiny_model_path):
    """A server holding one sequence at most (max_running_requests 1, no queue), and its
    engine."""
    engine = Engine(
        model=str(tiny_model_path),
        device="cpu",
        dtype="float32",
        max_kv_tokens=1024,
        max_running_requests=1,
    )
    server = LiveServer(engine, max_queued_requests=0)
    yield server, engine
    server.stop()
    engine.shutdown()


@contextlib.contextmanager
def filled(server: LiveServer, engine):
    """The server full for the block: a completion admitted, the engine held till it ends."""
    release = hold_engine(engine)
    body = {"prompt": "Hi", "max_tokens": 1}
    running = threading.Thread(
        target=httpx.post, args=(server.url + "/v1/completions",), kwargs={"json": body}
    )
    running.start()
    try:
        service = server.server.config.app.state.service
        wait_for(lambda: service.num_active == 1, 30, "the completion to be admitted")
        yield
    finally:
        release.set()
        running.join(60)


def test_a_full_server_answers_503_and_529_as_declared(full):
    server, engine = full
    api = schemathesis.openapi.from_url(server.url + "/openapi.json")
    with filled(server, engine):
        for path, body, status in [
            ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1}, 503),
            ("/v1/embeddings", {"input": "Hi"}, 503),
            ("/v1/messages", {"messages": CHAT, "max_tokens": 1}, 529),
        ]:
            response = ask(server, api, "post", path, body, checks=RETRIED_CHECKS)
            assert response.status_code == status, response.text
            assert int(response.headers["Retry-After"]) > 0


# ---- what the checks catch -------------------------------------------------------------------


def answer(status: int, body: bytes, media_type: str = "application/json") -> Response:
    request = requests.Request("POST", "http://braid.invalid/").prepare()
    return Response(status, {"content-type": [media_type]}, body, request, 0.0, True)


def event_stream(*events: tuple[str | None, object]) -> bytes:
    out = b""
    for name, data in events:
        out += b"" if name is None else f"event: {name}\n".encode()
        out += b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode())
        out += b"\n\n"
    return out


CHUNK = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 1,
    "model": "tiny",
    "choices": [{"index": 0, "text": "a", "logprobs": None, "finish_reason": None}],
}
ERROR = {"error": {"message": "no", "type": "invalid_request_error", "param": None, "code": 400}}
STRAYS = [
    # (method, path, status, body, media type): each fails the checks
    ("get", "/v1/models", 200, {"object": "list"}, "application/json"),  # no data
    ("get", "/v1/models", 200, {"object": "list", "data": []}, "text/plain"),
    ("get", "/v1/models", 422, ERROR, "application/json"),  # undeclared
    ("post", "/v1/completions", 400, {"detail": "Bad Request"}, "application/json"),
    ("post", "/v1/messages", 400, ERROR, "application/json"),  # OpenAI's shape there
    ("post", "/v1/chat/completions", 404, {"error": {"message": "no"}}, "application/json"),
    (
        "post",
        "/v1/completions",
        200,
        event_stream((None, {**CHUNK, "created": "now"}), (None, b"[DONE]")),
        "text/event-stream",
    ),
    (
        "post",
        "/v1/completions",
        200,
        event_stream((None, b"{not json"), (None, b"[DONE]")),
        "text/event-stream",
    ),
    (
        "post",
        "/v1/completions",
        200,
        event_stream(("chunk", CHUNK), (None, b"[DONE]")),  # a named event
        "text/event-stream",
    ),
    (
        "post",
        "/v1/messages",
        200,
        event_stream(("message_stop", {"type": "content_block_stop", "index": 0})),
        "text/event-stream",
    ),
    (
        "post",
        "/v1/responses",
        200,
        event_stream(("response.output_text.delta", {"type": "response.output_text.delta"})),
        "text/event-stream",
    ),
]


@pytest.mark.parametrize(("method", "path", "status", "body", "media_type"), STRAYS)
def test_an_answer_off_the_document_fails_the_checks(api, method, path, status, body, media_type):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(FailureGroup):
        api[path][method.upper()].Case().validate_response(
            answer(status, raw, media_type), checks=CHECKS
        )


def test_the_same_answers_on_the_document_pass(api):
    """The stray answers' well-formed counterparts: what fails above is the fault alone."""
    case = api["/v1/completions"]["POST"].Case()
    stream = event_stream((None, CHUNK), (None, ERROR), (None, b"[DONE]"))
    case.validate_response(answer(200, stream, "text/event-stream"), checks=CHECKS)
    case = api["/v1/messages"]["POST"].Case()
    stop = event_stream(("message_stop", {"type": "message_stop"}))
    case.validate_response(answer(200, stop, "text/event-stream"), checks=CHECKS)
    error = {"type": "error", "error": {"type": "invalid_request_error", "message": "no"}}
    case.validate_response(answer(400, json.dumps(error).encode()), checks=CHECKS)
