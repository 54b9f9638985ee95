"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens, for the anthropic
SDK and Claude-style agents.

A request is translated into the conversation it means (anthropic_wire.py), which the
conversation pipeline (chat/pipeline.py) renders, constrains, streams and parses exactly as
for /v1/chat/completions. Only the wire format is Anthropic's: content blocks (the model's
thought a thinking block first, its signature empty), tool_use blocks whose input is an
object, stop reasons, usage split into fresh and cached input tokens (and the thought's
tokens apart), SSE events with `event:` names, and errors as
{"type": "error", "error": {"type": ..., "message": ...}}.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from braid.runtime.server.chat import pipeline, tools
from braid.runtime.server.chat.conversation import ConversationRequest
from braid.runtime.server.chat.pipeline import Prepared
from braid.runtime.server.chat.reply import Reply
from braid.runtime.server.http.connections import RETRY_AFTER_S
from braid.runtime.server.http.disconnects import unless_disconnected
from braid.runtime.server.request_context import context_of
from braid.runtime.server.routes.anthropic_wire import (
    CountTokensRequest,
    MessagesRequest,
    check_limits,
    check_thread,
    conversation,
    sampling,
)
from braid.runtime.server.service import Overloaded, Service
from braid.runtime.server.wire import (
    ANTHROPIC_PATH,
    BadRequest,
    ModelNotFound,
    anthropic_error_body,
    convert,
    decode_object,
)

# ---- errors ----------------------------------------------------------------------------------

# The errors a request may cause, as Anthropic answers them (the first that matches): its
# 529 for a full server, and the details a thread's rejection carries. Others go on to the
# app's handlers, which answer in Anthropic's shape here too (wire.refusal_body; a 500 is
# logged there).
_ERRORS: list[tuple[type[Exception], int, str]] = [
    (ModelNotFound, 404, "not_found_error"),
    (Overloaded, 529, "overloaded_error"),  # Anthropic's status for it; its SDK retries it
    (ValueError, 400, "invalid_request_error"),  # BadRequest, and the engine's
]


def error_response(
    status: int, kind: str, message: str, details: dict[str, Any] | None = None
) -> JSONResponse:
    return JSONResponse(anthropic_error_body(kind, message, details), status)


def _anthropic_errors(
    route: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    @functools.wraps(route)
    async def answer(request: Request) -> Response:
        try:
            return await route(request)
        except Exception as e:
            for kind, status, name in _ERRORS:
                if isinstance(e, kind):
                    details = getattr(e, "details", None)
                    reply = error_response(status, name, str(e) or type(e).__name__, details)
                    if isinstance(e, Overloaded):
                        reply.headers["Retry-After"] = str(RETRY_AFTER_S)
                    return reply
            raise

    return answer


# ---- the reply -------------------------------------------------------------------------------


def _tool_use(call: tools.Call, whole: bool) -> dict[str, Any]:
    """A call as a tool_use block: its input parsed when `whole` (a call max_tokens cut off
    has none: {}), else empty, to be streamed as JSON pieces."""
    block = {"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"), "name": call.name}
    if not whole:
        return block | {"input": {}}
    try:
        return block | {"input": json.loads(call.arguments)}
    except ValueError:
        return block | {"input": {}}


@dataclass(frozen=True)
class _Ending:
    """What tells why a reply ended, in Anthropic's terms."""

    tokenizer: Any
    stops: list[str]
    length: str  # the stop_reason of an output that ran out of tokens

    def reason(
        self, engine_reason: str | None, reply: Reply, text: str, token_ids: list[int]
    ) -> tuple[str, str | None]:
        """The stop_reason and stop_sequence of an output the engine ended for
        `engine_reason` (`reply` read to its end). The engine cuts the output before a stop
        string without saying which one matched: it is the first one the output's tokens
        spell past the text."""
        if reply.finish_reason == "tool_calls":
            return "tool_use", None
        if engine_reason == "length":
            return self.length, None
        if engine_reason == "stop" and self.stops:
            tail = self.tokenizer.decode(token_ids, skip_special_tokens=True)[len(text) :]
            found = [(tail.find(s), s) for s in self.stops if s in tail]
            if found:
                return "stop_sequence", min(found)[1]
        return "end_turn", None


def _thinking(text: str) -> dict[str, Any]:
    # Signatures prove a thought came from Anthropic's servers: braid's are empty.
    return {"type": "thinking", "thinking": text, "signature": ""}


def _usage(meta: dict[str, Any]) -> dict[str, Any]:
    """Anthropic counts the input read from the cache apart from the rest, and the thought's
    tokens (its markers among them) within the output's."""
    prompt = meta.get("prompt_tokens", 0)
    # The engine counts tokens a constraint forces at the start, found in the cache with the
    # prompt, as cached prompt tokens: they are not input.
    cached = min(meta.get("cached_tokens", 0), prompt)
    return {
        "input_tokens": prompt - cached,
        "output_tokens": meta.get("completion_tokens", 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens_details": {"thinking_tokens": meta.get("reasoning_tokens", 0)},
    }


class _Blocks:
    """Streamed output as content-block events: the thought's deltas in a thinking block
    (its empty signature last), text deltas in a text block; each call a tool_use block whose
    input arrives as pieces of JSON."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.num_blocks = 0
        self.open: str | None = None  # the type of the block open, the last one

    def feed(self, text: str, finish_reason: str | None) -> list[tuple[str, dict[str, Any]]]:
        """The events of a chunk's text (`finish_reason`: the engine's, on the last one)."""
        return self._events(self.reply.read(text, finish_reason))

    def finish(self) -> list[tuple[str, dict[str, Any]]]:
        return self._close()

    def _events(self, parsed: list[tuple]) -> list[tuple[str, dict[str, Any]]]:
        events = []
        for kind, *rest in parsed:
            if kind == "reasoning":
                if self.open != "thinking":
                    events += self._start(_thinking(""))
                events.append(self._delta({"type": "thinking_delta", "thinking": rest[0]}))
            elif kind == "text":
                if not rest[0]:
                    continue
                if self.open != "text":
                    events += self._start({"type": "text", "text": ""})
                events.append(self._delta({"type": "text_delta", "text": rest[0]}))
            elif kind == "call":
                events += self._start(_tool_use(self.reply.calls[rest[0]], whole=False))
            else:  # a piece of the open call's arguments
                events.append(self._delta({"type": "input_json_delta", "partial_json": rest[1]}))
        return events

    def _start(self, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        events = self._close()
        self.num_blocks += 1
        self.open = block["type"]
        return events + [
            ("content_block_start", {"index": self.num_blocks - 1, "content_block": block})
        ]

    def _delta(self, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return "content_block_delta", {"index": self.num_blocks - 1, "delta": delta}

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        if self.open is None:
            return []
        events = []
        if self.open == "thinking":
            events.append(self._delta({"type": "signature_delta", "signature": ""}))
        self.open = None
        return events + [("content_block_stop", {"index": self.num_blocks - 1})]


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (name.encode(), msgspec.json.encode({"type": name, **data}))


def _stream(
    svc: Service, prepared: Prepared, head: dict[str, Any], ending: _Ending
) -> StreamingResponse:
    """The reply as Anthropic's events. Admission is checked now and held while it streams;
    a client that disconnects cancels it, which aborts the engine request. Once the response
    has started, an error can only be an `error` event."""
    svc.check_room(1)

    async def body() -> AsyncIterator[bytes]:
        with svc.admit(1, checked=True):  # the headers are out: no 529 now
            # The cached part of the prompt is known at the end: message_delta has the split.
            usage = {"input_tokens": len(prepared.ids), "output_tokens": 0}
            start = {"content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
            yield _event("message_start", {"message": head | start})
            reply = prepared.reply()
            blocks = _Blocks(reply)
            text, token_ids = [], []
            try:
                async for chunk in prepared.stream(prepared.ids, prepared.params):
                    text.append(chunk.text)
                    token_ids += chunk.token_ids
                    for name, data in blocks.feed(chunk.text, chunk.finish_reason):
                        yield _event(name, data)
                for name, data in blocks.finish():
                    yield _event(name, data)
                reason, sequence = ending.reason(
                    chunk.finish_reason, reply, "".join(text), token_ids
                )
                delta = {"stop_reason": reason, "stop_sequence": sequence}
                yield _event("message_delta", {"delta": delta, "usage": _usage(chunk.meta or {})})
                yield _event("message_stop", {})
            except BadRequest as e:  # the request's own parameters failed it midway
                yield _event("error", anthropic_error_body("invalid_request_error", str(e)))
            except Exception as e:
                yield _event("error", anthropic_error_body("api_error", str(e)))

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


# ---- the routes ------------------------------------------------------------------------------


@_anthropic_errors
async def messages(request: Request) -> Response:
    svc: Service = request.app.state.service
    obj = decode_object(await request.body())
    check_limits(obj, svc.limits)
    req = convert(obj, MessagesRequest)
    check_thread(req)
    ctx = context_of(request, salt=req.cache_salt, lora=svc.check_model(req.model))
    # As on Anthropic's newer models, a max_tokens past the context's end is not refused: the
    # reply stops there (so an agent may ask for the most without counting its prompt).
    asked = ConversationRequest(conversation(req), sampling(req), fit_max_tokens=True)
    prepared = await pipeline.prepare(svc, ctx, asked, request)
    stops = prepared.params.stop  # as the tool constraint left them (none for calls only)
    ending = _Ending(
        svc.engine.tokenizer,
        [stops] if isinstance(stops, str) else list(stops or []),
        "model_context_window_exceeded" if prepared.max_tokens_cut else "max_tokens",
    )
    head = {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": svc.reply_model(req.model),
    }
    if req.stream:
        return _stream(svc, prepared, head, ending)

    [out] = await unless_disconnected(request, svc.collect_all(prepared.jobs, prepared.stream))
    reply = prepared.reply()
    reply.read(out.text, out.finish_reason)
    content = [_thinking(reply.reasoning)] if reply.reasoning else []
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    content += [_tool_use(call, whole=True) for call in reply.calls]
    reason, sequence = ending.reason(out.finish_reason, reply, out.text, out.token_ids)
    body = {
        **head,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": _usage(out.meta),
    }
    return JSONResponse(body)


@_anthropic_errors
async def count_tokens(request: Request) -> Response:
    """The prompt's tokens as /v1/messages would count them (tools included); nothing runs."""
    svc: Service = request.app.state.service
    obj = decode_object(await request.body())
    check_limits(obj, svc.limits)
    req = convert(obj, CountTokensRequest)
    svc.check_model(req.model)
    prompt, _ = await pipeline.prompt(svc, conversation(req))
    return JSONResponse({"input_tokens": len(prompt)})


ROUTES = [
    Route(ANTHROPIC_PATH, messages, methods=["POST"]),
    Route(ANTHROPIC_PATH + "/count_tokens", count_tokens, methods=["POST"]),
]
