"""Property-based fuzzing of the HTTP API from its own OpenAPI document (Schemathesis, as vLLM
runs): requests drawn from every route's schema against a live server on the tiny model. No
request may get a 5xx or hang, every answer must be one the document declares (its status,
its media type, its body: each event of a stream), and /health answers after each. A short
budget runs by default; `-m slow` runs the long one. test_openapi_responses.py checks the
declared answers against requests the fuzz rarely draws (streams, calls, thoughts, errors)."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from conftest import LiveServer
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from braid.runtime import Engine

# Routes whose effect is the server's own to decide, not the client's: left out of the fuzz.
SKIPPED = ("/flush_cache", "/metrics")
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def fuzz_server(tiny_model_path):
    engine = Engine(
        model=str(tiny_model_path),
        device="cpu",
        dtype="float32",
        max_kv_tokens=4096,
        grammar_compile_timeout_s=5.0,
    )
    server = LiveServer(engine, max_queued_requests=16)
    yield server
    server.stop()
    engine.shutdown()


def fuzz(server: LiveServer, examples: int) -> int:
    """Draw `examples` requests per operation from the server's own document and send them;
    the number of requests sent."""
    api = schemathesis.openapi.from_url(server.url + "/openapi.json")
    sent = 0
    for result in api.get_all_operations():
        operation = result.ok()
        if operation.path in SKIPPED:
            continue

        @given(case=operation.as_strategy())
        @settings(
            max_examples=examples,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def run(case) -> None:
            nonlocal sent
            # Every route but /health generates or compiles: past the timeout it hung.
            case.call_and_validate(base_url=server.url, checks=CHECKS, timeout=120)
            sent += 1
            assert httpx.get(server.url + "/health", timeout=30).status_code == 200

        run()
    return sent


def test_fuzz_short(fuzz_server):
    assert fuzz(fuzz_server, 6) > 60


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_fuzz_long(fuzz_server):
    assert fuzz(fuzz_server, 150) > 1000


def test_the_document_covers_every_route(fuzz_server):
    doc = httpx.get(fuzz_server.url + "/openapi.json").json()
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/messages", "/generate"):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"]["properties"], path
    assert "/v1/models/{model_id}" in doc["paths"]
