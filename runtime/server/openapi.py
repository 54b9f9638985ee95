"""GET /openapi.json: an OpenAPI 3.1 document of every route. Request bodies are built from
the wire Structs the routes decode, so the document says what they accept and cannot drift
from it; each operation's answers (its 200's bodies and its error statuses) are declared in
openapi_responses.py. It is what client generators read, and what the HTTP fuzz
(tests/runtime/server/test_http_fuzz.py) draws requests from and checks answers against."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from braid.runtime.protocol.sampling_params import SamplingParams
from braid.runtime.protocol.wire_fields import SAMPLING_FIELDS
from braid.runtime.server import openapi_responses
from braid.runtime.server.routes.anthropic_wire import CountTokensRequest, MessagesRequest
from braid.runtime.server.routes.embeddings import EmbeddingRequest
from braid.runtime.server.routes.responses_wire import ResponsesRequest
from braid.runtime.server.routes.tokens import (
    Detokenize,
    TokenizeChat,
    TokenizeContent,
    TokenizePrompt,
)
from braid.runtime.server.wire import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    LoraAdapterRequest,
    PrepareRequest,
    ReleaseRequest,
    ScoreRequest,
)

# (method, path) -> the Structs whose fields make its body (an API's own Struct, then
# SamplingParams where the route reads sampling fields by their names), or alternatives.
_BODIES: dict[tuple[str, str], tuple[str, list[type]]] = {
    ("post", "/v1/completions"): ("merge", [CompletionRequest, SamplingParams]),
    ("post", "/v1/chat/completions"): ("merge", [ChatCompletionRequest, SamplingParams]),
    ("post", "/v1/responses"): ("merge", [ResponsesRequest, SamplingParams]),
    ("post", "/v1/messages"): ("merge", [MessagesRequest]),
    ("post", "/v1/messages/count_tokens"): ("merge", [CountTokensRequest]),
    ("post", "/v1/embeddings"): ("merge", [EmbeddingRequest]),
    ("post", "/tokenize"): ("one_of", [TokenizePrompt, TokenizeChat, TokenizeContent]),
    ("post", "/detokenize"): ("merge", [Detokenize]),
    ("post", "/generate"): ("merge", [GenerateRequest]),
    ("post", "/braid/score"): ("merge", [ScoreRequest]),
    ("post", "/braid/release"): ("merge", [ReleaseRequest]),
    ("post", "/braid/prepare"): ("merge", [PrepareRequest]),
    ("post", "/load_lora_adapter"): ("merge", [LoraAdapterRequest]),
    ("post", "/unload_lora_adapter"): ("merge", [LoraAdapterRequest]),
}
_REF = "#/components/schemas/{name}"


async def openapi(request: Request) -> Response:
    state = request.app.state
    if getattr(state, "openapi", None) is None:
        state.openapi = document(request.app.routes)
    return JSONResponse(state.openapi)


def document(routes: list) -> dict[str, Any]:
    """The OpenAPI document of these routes."""
    structs = sorted({t for _, types in _BODIES.values() for t in types}, key=lambda t: t.__name__)
    refs, components = msgspec.json.schema_components(structs, ref_template=_REF)
    by_type = dict(zip(structs, refs, strict=True))
    answered: set[type] = set()

    def ref(body: type) -> dict[str, Any]:
        answered.add(body)
        return {"$ref": _REF.format(name=body.__name__)}

    paths: dict[str, dict] = {}
    for route in routes:
        if not isinstance(route, Route):
            continue
        path = re.sub(r"\{(\w+)(:\w+)?\}", r"{\1}", route.path)
        params = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in re.findall(r"\{(\w+)\}", path)
        ]
        for method in sorted(m.lower() for m in route.methods or () if m != "HEAD"):
            operation: dict[str, Any] = {
                "operationId": f"{method}_{path}",
                "responses": openapi_responses.responses(method, path, ref),
            }
            if params:
                operation["parameters"] = params
            if (method, path) in _BODIES:
                kind, types = _BODIES[method, path]
                body = (
                    _merged(types, components)
                    if kind == "merge"
                    else {"oneOf": [by_type[t] for t in types]}
                )
                content = {"application/json": {"schema": body}}
                operation["requestBody"] = {"required": True, "content": content}
            paths.setdefault(path, {})[method] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "braid", "version": "1"},
        "paths": paths,
        "components": {"schemas": components | _answer_components(answered, components)},
    }


def _answer_components(bodies: set[type], requests: dict[str, Any]) -> dict[str, Any]:
    """The components of the answers' bodies, each under its type's name (as `ref` named
    it): a name msgspec had to qualify, or one a request's component holds already, would
    leave a reference pointing at another schema."""
    ordered = sorted(bodies, key=lambda t: t.__name__)
    refs, components = msgspec.json.schema_components(ordered, ref_template=_REF)
    named = [r["$ref"] for r in refs]
    clashes = {k for k in components.keys() & requests.keys() if components[k] != requests[k]}
    if clashes or named != [_REF.format(name=t.__name__) for t in ordered]:
        raise ValueError(f"answer bodies share a name with another schema: {clashes or named}")
    for body in ordered:
        if dataclasses.is_dataclass(body):  # answered through asdict: every field, defaulted too
            schema = components[body.__name__]
            schema["required"] = list(schema["properties"])
    return components


def _merged(types: list[type], components: dict[str, Any]) -> dict[str, Any]:
    """One object schema with every field of `types` (SamplingParams only the fields the
    routes read by its names), required where the first type requires it."""
    first = components[types[0].__name__]
    properties = dict(first.get("properties", {}))
    for t in types[1:]:
        fields = components[t.__name__].get("properties", {})
        properties |= {
            k: v for k, v in fields.items() if k in SAMPLING_FIELDS and k not in properties
        }
    schema = {"type": "object", "properties": properties}
    if first.get("required"):
        schema["required"] = first["required"]
    return schema


ROUTES = [Route("/openapi.json", openapi, methods=["GET"])]
