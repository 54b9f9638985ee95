"""What each operation of /openapi.json answers: its 200's bodies by media type (the Structs of
openapi_bodies.py and openapi_agent_bodies.py; a stream's events, each checked against its
schema), and every error status it can answer, in braid's error shape (Anthropic's under
/v1/messages). There is no `default` response: a status an operation does not declare is a
failure of the HTTP fuzz's status_code_conformance check."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

from braid.runtime.config import EngineConfig
from braid.runtime.server.openapi_agent_bodies import (
    MESSAGE_EVENTS,
    RESPONSE_EVENTS,
    AnthropicMessage,
    DeletedResponse,
    ResponseObject,
    TokenCount,
)
from braid.runtime.server.openapi_bodies import (
    AnthropicError,
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChunk,
    DashboardData,
    Detokenized,
    EmbeddingList,
    Error,
    GenerateResult,
    LoraAdapters,
    ModelCard,
    ModelInfo,
    ModelList,
    OpenApiDocument,
    Prepared,
    Released,
    Scores,
    ServerInfoFields,
    Tokenized,
    TokenizedContent,
)

# A body's schema as a reference to its component (recording that it needs one).
Ref = Callable[[type], dict[str, Any]]
JSON, SSE = "application/json", "text/event-stream"


@dataclasses.dataclass(frozen=True)
class AnyOf:
    bodies: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class AllOf:
    """One object with the fields of each (/server_info: the engine config's and its own)."""

    bodies: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class DataEvents:
    """A stream of unnamed `data:` events, each a JSON `chunk` (or an Error: the stream failed
    midway, after its 200), then `data: [DONE]`."""

    chunk: type


@dataclasses.dataclass(frozen=True)
class NamedEvents:
    """A stream of events whose `event:` name is their data's `type`: each one of `events`
    (tagged Structs, the tag that name)."""

    events: tuple[type, ...]


@dataclasses.dataclass(frozen=True)
class Answers:
    """An operation's 200 (media type -> its body: a Struct, `str` for text, or one of the
    classes above; none for an empty body) and its error statuses."""

    ok: dict[str, Any]
    errors: tuple[int, ...]
    anthropic: bool = False  # its errors in Anthropic's shape


# Every operation may meet the guard (403) or fail (500); all but the open ones (/health,
# /metrics) need the API key where the server has one (401). One that reads a body may find
# it malformed (400), over --max-request-bytes (413) or not JSON (415). One that runs on the
# engine is admitted under the queue limit (503) and cancelled when its client leaves (499).
_OPEN = (403, 500)
_KEYED = (401, *_OPEN)
_BODY = (400, 413, 415)
_RUNS = (499, 503)
_GENERATES = (*_KEYED, *_BODY, 404, *_RUNS)  # 404: the model it names is not served

ANSWERS: dict[tuple[str, str], Answers] = {
    ("get", "/v1/models"): Answers({JSON: ModelList}, _KEYED),
    ("get", "/v1/models/{model_id}"): Answers({JSON: ModelCard}, (*_KEYED, 404)),
    ("post", "/v1/completions"): Answers(
        {JSON: Completion, SSE: DataEvents(CompletionChunk)}, _GENERATES
    ),
    ("post", "/v1/chat/completions"): Answers(
        {JSON: ChatCompletion, SSE: DataEvents(ChatCompletionChunk)}, _GENERATES
    ),
    ("post", "/v1/responses"): Answers(
        {JSON: ResponseObject, SSE: NamedEvents(RESPONSE_EVENTS)}, _GENERATES
    ),
    ("get", "/v1/responses/{response_id}"): Answers({JSON: ResponseObject}, (*_KEYED, 404)),
    ("delete", "/v1/responses/{response_id}"): Answers({JSON: DeletedResponse}, (*_KEYED, 404)),
    # Overloaded is Anthropic's 529 there, which its SDK retries.
    ("post", "/v1/messages"): Answers(
        {JSON: AnthropicMessage, SSE: NamedEvents(MESSAGE_EVENTS)},
        (*_KEYED, *_BODY, 404, 499, 529),
        anthropic=True,
    ),
    ("post", "/v1/messages/count_tokens"): Answers(
        {JSON: TokenCount}, (*_KEYED, *_BODY, 404), anthropic=True
    ),
    ("post", "/v1/embeddings"): Answers({JSON: EmbeddingList}, _GENERATES),
    ("post", "/tokenize"): Answers(
        {JSON: AnyOf((Tokenized, TokenizedContent))}, (*_KEYED, *_BODY, 404)
    ),
    ("post", "/detokenize"): Answers({JSON: Detokenized}, (*_KEYED, *_BODY, 404)),
    # One result per prompt and sample: a batch's (or n > 1's) as a list.
    ("post", "/generate"): Answers(
        {JSON: AnyOf((GenerateResult, list[GenerateResult])), SSE: DataEvents(GenerateResult)},
        (*_KEYED, *_BODY, *_RUNS),
    ),
    ("get", "/get_model_info"): Answers({JSON: ModelInfo}, _KEYED),
    ("get", "/model_info"): Answers({JSON: ModelInfo}, _KEYED),
    ("get", "/server_info"): Answers({JSON: AllOf((EngineConfig, ServerInfoFields))}, _KEYED),
    ("get", "/get_server_info"): Answers({JSON: AllOf((EngineConfig, ServerInfoFields))}, _KEYED),
    ("get", "/flush_cache"): Answers({"text/plain": str}, _KEYED),
    ("post", "/flush_cache"): Answers({"text/plain": str}, _KEYED),
    ("get", "/health"): Answers({}, _OPEN),
    ("get", "/health_generate"): Answers({}, (*_KEYED, *_RUNS)),
    ("get", "/metrics"): Answers({"text/plain": str}, _OPEN),  # Prometheus' text format
    ("post", "/braid/score"): Answers({JSON: Scores}, (*_KEYED, *_BODY, *_RUNS)),
    ("post", "/braid/release"): Answers({JSON: Released}, (*_KEYED, *_BODY)),
    ("post", "/braid/prepare"): Answers({JSON: Prepared}, (*_KEYED, *_BODY, *_RUNS)),
    ("get", "/dashboard"): Answers({"text/html": str}, _KEYED),
    ("get", "/dashboard/data"): Answers({JSON: DashboardData}, _KEYED),
    ("post", "/load_lora_adapter"): Answers({JSON: LoraAdapters}, (*_KEYED, *_BODY)),
    ("post", "/unload_lora_adapter"): Answers({JSON: LoraAdapters}, (*_KEYED, *_BODY)),
    ("get", "/openapi.json"): Answers({JSON: OpenApiDocument}, _KEYED),
}

_WHY = {
    400: "The request is malformed, or asks for what the server cannot do (the message says "
    "which field).",
    401: "The API key is missing or wrong (a server started with --api-key).",
    403: "A Host or Origin the server does not answer (--allowed-hosts, --allowed-origins), or "
    "an admin route without the admin key.",
    404: "The model named is not served, or the object named does not exist.",
    413: "The body is over the server's limit (--max-request-bytes).",
    415: "The body is not sent as application/json.",
    499: "The client left before the answer (which nobody reads).",
    500: "The server failed.",
    503: "The server is at its queue limit, or its constraint compile queue is full: retry "
    "after Retry-After seconds.",
    529: "Overloaded, as Anthropic answers it: retry after Retry-After seconds.",
}
_RETRIED = {503, 529}


def responses(method: str, path: str, ref: Ref) -> dict[str, Any]:
    """The OpenAPI responses object of an operation."""
    try:
        answers = ANSWERS[method, path]
    except KeyError:
        raise KeyError(f"{method.upper()} {path}: declare its answers in ANSWERS") from None
    ok: dict[str, Any] = {"description": "OK"}
    if answers.ok:
        ok["content"] = {kind: {"schema": _schema(body, ref)} for kind, body in answers.ok.items()}
    out = {"200": ok}
    shape = ref(AnthropicError if answers.anthropic else Error)
    for status in sorted(answers.errors):
        out[str(status)] = {"description": _WHY[status], "content": {JSON: {"schema": shape}}}
        if status in _RETRIED:
            retry = {"required": True, "schema": {"type": "integer"}}
            out[str(status)]["headers"] = {"Retry-After": retry}
    return out


def _schema(body: Any, ref: Ref) -> dict[str, Any]:
    if body is str:
        return {"type": "string"}
    if typing.get_origin(body) is list:
        return {"type": "array", "items": _schema(typing.get_args(body)[0], ref)}
    if isinstance(body, AnyOf):
        return {"anyOf": [_schema(b, ref) for b in body.bodies]}
    if isinstance(body, AllOf):
        return {"allOf": [_schema(b, ref) for b in body.bodies]}
    if isinstance(body, DataEvents):
        return _data_events(body.chunk, ref)
    if isinstance(body, NamedEvents):
        return _named_events(body.events, ref)
    return ref(body)


# Schemathesis reads an event stream as a list of {"event", "data", ...} objects (the `event`
# "message" where the stream names none), which the media type's schema describes one at a
# time (OpenAPI 3.1's convention, before 3.2's itemSchema); `contentSchema` is the data's as
# JSON.
def _json_text(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "string", "contentMediaType": JSON, "contentSchema": schema}


def _data_events(chunk: type, ref: Ref) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["event", "data"],
        "properties": {"event": {"const": "message"}, "data": {"type": "string"}},
        "if": {"properties": {"data": {"const": "[DONE]"}}},
        "else": {"properties": {"data": _json_text({"anyOf": [ref(chunk), ref(Error)]})}},
    }


def _named_events(events: tuple[type, ...], ref: Ref) -> dict[str, Any]:
    names = [event.__struct_config__.tag for event in events]
    return {
        "type": "object",
        "required": ["event", "data"],
        "properties": {"event": {"enum": names}, "data": {"type": "string"}},
        "allOf": [
            {
                "if": {"properties": {"event": {"const": name}}},
                "then": {"properties": {"data": _json_text(ref(event))}},
            }
            for name, event in zip(names, events, strict=True)
        ],
    }
