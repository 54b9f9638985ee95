"""Property-based fuzzing of the HTTP API from its own OpenAPI document (Schemathesis, as vLLM
runs): requests drawn from every route's schema against a live server on the tiny model, in
both of Schemathesis' modes: positive (bodies the schema admits) and negative (bodies it
does not, which must be refused with a 4xx). No request may get a 5xx or hang, every answer
must be one the document declares (its status, its media type, its body: each event of a
stream), and /health answers after each. A short budget runs by default; `-m slow` runs the
long one. test_openapi_responses.py checks the declared answers against requests the fuzz
rarely draws (streams, calls, thoughts, errors)."""

from __future__ import annotations

import re

import httpx
import pytest
import schemathesis
from conftest import LiveServer
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from braid.runtime import Engine

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
    # With adapter updates on, so the fuzz reaches every route braid serve can have.
    server = LiveServer(engine, max_queued_requests=16, lora_updates=True)
    yield server
    server.stop()
    engine.shutdown()


def fuzz(server: LiveServer, examples: int, mode: GenerationMode) -> dict[str, int]:
    """Draw `examples` requests in `mode` per operation from the server's own document and
    send them; the number sent, per operation."""
    api = schemathesis.openapi.from_url(server.url + "/openapi.json")
    # A negative case is one the document forbids: the server must refuse it, not answer it.
    checks = CHECKS + ([negative_data_rejection] if mode == GenerationMode.NEGATIVE else [])
    sent: dict[str, int] = {}
    for result in api.get_all_operations():
        operation = result.ok()
        if mode == GenerationMode.NEGATIVE and not len(operation.body):
            continue  # no body: no request breaks the document (any string is a path's id)
        label = f"{operation.method.upper()} {operation.path}"
        sent[label] = 0

        @given(case=operation.as_strategy(mode))
        @settings(
            max_examples=examples,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def run(case) -> None:
            # Every route but /health generates or compiles: past the timeout it hung.
            case.call_and_validate(base_url=server.url, checks=checks, timeout=120)
            sent[label] += 1  # noqa: B023 (run() is called in this iteration)
            assert httpx.get(server.url + "/health", timeout=30).status_code == 200

        run()
    return sent


MODES = pytest.mark.parametrize("mode", list(GenerationMode), ids=lambda m: m.value)


@MODES
def test_fuzz_short(fuzz_server, mode):
    sent = fuzz(fuzz_server, 6, mode)
    assert all(sent.values()), [op for op, n in sent.items() if not n]


@pytest.mark.slow
@pytest.mark.timeout(3600)
@MODES
def test_fuzz_long(fuzz_server, mode):
    sent = fuzz(fuzz_server, 150, mode)
    assert sum(sent.values()) > 3000 and all(sent.values()), sent


def test_the_document_covers_every_route(fuzz_server):
    """Every route the app serves is in the document (so the fuzz draws requests for it), with
    a schema for each body it takes."""
    served = {
        (method.lower(), re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path))  # {id:path}: {id}
        for route in fuzz_server.server.config.app.routes
        for method in route.methods - {"HEAD"}
    }
    doc = httpx.get(fuzz_server.url + "/openapi.json").json()
    assert served == {(m, path) for path, ops in doc["paths"].items() for m in ops}
    for path, ops in doc["paths"].items():
        for op in ops.values():
            if "requestBody" in op:
                body = op["requestBody"]["content"]["application/json"]["schema"]
                assert {"properties", "$ref", "anyOf", "oneOf"} & body.keys(), path
