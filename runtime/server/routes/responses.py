"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

A request becomes the conversation it amounts to: `instructions` a system message, then the
stored conversation of `previous_response_id`, then the `input` items (messages; function_call
items as an assistant's tool calls; function_call_output items as tool messages), with the
function tools, tool_choice, parallel_tool_calls and chat_template_kwargs. The conversation
pipeline (chat/pipeline.py) does the rest, as for /v1/chat/completions; this module writes its
replies as Responses items and events. The output is a reasoning item (where the model
thought: its text as reasoning_text content, never summarized), then a message item or
function_call items; a call is output only once it is whole (its closing tag written), so
one cut off by max_output_tokens never appears, streamed or not. Reasoning items given back
as input are the thought of the assistant turn after them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from braid.runtime.protocol.outputs import StreamChunk
from braid.runtime.protocol.sampling_params import SamplingParams
from braid.runtime.server.chat import pipeline, tools
from braid.runtime.server.chat.conversation import Conversation, ConversationRequest
from braid.runtime.server.chat.reasoning_fields import Thinking
from braid.runtime.server.chat.reply import Reply
from braid.runtime.server.http.disconnects import unless_disconnected
from braid.runtime.server.request_context import context_of
from braid.runtime.server.response_store import ResponseStore
from braid.runtime.server.routes.responses_wire import (
    ResponsesRequest,
    chat_messages,
    check_limits,
    decode,
    function_tools,
    tool_choice,
)
from braid.runtime.server.service import Service
from braid.runtime.server.wire import (
    BadRequest,
    ChatMessage,
    Tool,
    decode_object,
    error_body,
    sampling_params,
)

# ---- the output: items and their events, as the text streams in ------------------------------


class _Writer:
    """A response's output items, built from the model's text as it streams, and the events
    that announce them (each `(type, event)`). The thought is one reasoning item, first;
    text is one message item; calls (when the output may be calls: read by the Reply, which
    reports each once it is whole) are function_call items, so a call cut off by
    max_output_tokens never appears."""

    def __init__(self, reply: Reply, mode: str | None) -> None:
        self.reply = reply
        # Under "required" or a named function (plan.mode; None: no tools) the output is
        # calls: the text a parser gives back at the end (a cut-off start of the call marker)
        # is not a reply.
        self.text_allowed = mode not in ("required", "named")
        self.items: list[dict[str, Any]] = []
        self.seq = 0
        self._message: tuple[str, int] | None = None  # the open message: id, output index
        self._pieces: list[str] = []
        self._thought: tuple[str, int] | None = None  # the open reasoning item
        self._thought_pieces: list[str] = []

    def event(self, kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
        self.seq += 1
        return kind, {"type": kind, "sequence_number": self.seq - 1, **fields}

    def feed(self, text: str, finish_reason: str | None = None) -> list[tuple[str, dict]]:
        """The events of a chunk's text (`finish_reason`: the engine's, on the last one)."""
        return self._read(self.reply.read(text, finish_reason))

    def finish(self, finish_reason: str | None) -> list[tuple[str, dict]]:
        status = "incomplete" if finish_reason == "length" else "completed"
        out = self._close_thought(status)
        if self._message is None and self.text_allowed and self.reply.is_text:
            out += self._open_message()  # an empty reply is still a message
        if self._message is not None:
            out += self._close_message(status)
        return out

    def _read(self, events: list[tuple]) -> list[tuple[str, dict]]:
        out = []
        for e in events:
            if e[0] == "reasoning":
                out += self._add_thought(e[1])
                continue
            if e[0] in ("text", "call"):
                out += self._close_thought("completed")
            if e[0] == "text" and self.text_allowed:
                out += self._add_text(e[1])
            elif e[0] == "call":  # whole: its arguments come with it
                out += self._add_call(self.reply.calls[e[1]])
        return out

    def _add_thought(self, text: str) -> list[tuple[str, dict]]:
        out = []
        if self._thought is None:
            item_id, index = f"rs_{uuid.uuid4().hex}", len(self.items)
            self._thought = item_id, index
            where = {"item_id": item_id, "output_index": index, "content_index": 0}
            added = _reasoning_item(item_id, "in_progress", None)
            out += [
                self.event("response.output_item.added", output_index=index, item=added),
                self.event("response.content_part.added", **where, part=_thought_part("")),
            ]
        item_id, index = self._thought
        self._thought_pieces.append(text)
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        return out + [self.event("response.reasoning_text.delta", **where, delta=text)]

    def _close_thought(self, status: str) -> list[tuple[str, dict]]:
        """The reasoning item, once the thought has ended (the answer begins, or the output
        ends)."""
        if self._thought is None:
            return []
        (item_id, index), text = self._thought, "".join(self._thought_pieces)
        self._thought, self._thought_pieces = None, []
        item = _reasoning_item(item_id, status, text)
        self.items.append(item)
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        return [
            self.event("response.reasoning_text.done", **where, text=text),
            self.event("response.content_part.done", **where, part=_thought_part(text)),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def _add_text(self, text: str) -> list[tuple[str, dict]]:
        if not text:
            return []
        out = self._open_message() if self._message is None else []
        item_id, index = self._message
        self._pieces.append(text)
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        return out + [self.event("response.output_text.delta", **where, delta=text, logprobs=[])]

    def _open_message(self) -> list[tuple[str, dict]]:
        item_id, index = f"msg_{uuid.uuid4().hex}", len(self.items)
        self._message = item_id, index
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        return [
            self.event(
                "response.output_item.added",
                output_index=index,
                item=_message_item(item_id, "in_progress", None),
            ),
            self.event("response.content_part.added", **where, part=_text_part("")),
        ]

    def _close_message(self, status: str) -> list[tuple[str, dict]]:
        item_id, index = self._message
        text = "".join(self._pieces)
        item = _message_item(item_id, status, text)
        self.items.append(item)
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        return [
            self.event("response.output_text.done", **where, text=text, logprobs=[]),
            self.event("response.content_part.done", **where, part=_text_part(text)),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def _add_call(self, call: tools.Call) -> list[tuple[str, dict]]:
        item_id, index = f"fc_{uuid.uuid4().hex}", len(self.items)
        item = _call_item(item_id, call, "completed")
        self.items.append(item)
        where = {"item_id": item_id, "output_index": index}
        added = _call_item(item_id, tools.Call(call.id, call.name), "in_progress")
        return [
            self.event("response.output_item.added", output_index=index, item=added),
            self.event("response.function_call_arguments.delta", **where, delta=call.arguments),
            self.event("response.function_call_arguments.done", **where, arguments=call.arguments),
            self.event("response.output_item.done", output_index=index, item=item),
        ]


def _thought_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def _reasoning_item(item_id: str, status: str, text: str | None) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "reasoning",
        "status": status,
        "summary": [],
        "content": [] if text is None else [_thought_part(text)],
        "encrypted_content": None,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, status: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _call_item(item_id: str, call: tools.Call, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "arguments": call.arguments,
        "call_id": call.id,
        "name": call.name,
    }


def _usage(meta: dict[str, Any]) -> dict[str, Any]:
    num_input, num_output = meta.get("prompt_tokens", 0), meta.get("completion_tokens", 0)
    return {
        "input_tokens": num_input,
        # Prefix-cache hits; nothing is written to a cache that a request pays for.
        "input_tokens_details": {
            "cached_tokens": meta.get("cached_tokens", 0),
            "cache_write_tokens": 0,
        },
        "output_tokens": num_output,
        # Tokens before the answer, the thought's markers among them (the engine's count).
        "output_tokens_details": {"reasoning_tokens": meta.get("reasoning_tokens", 0)},
        "total_tokens": num_input + num_output,
    }


# ---- the routes ------------------------------------------------------------------------------


async def create_response(request: Request) -> Response:
    svc: Service = request.app.state.service
    obj = decode_object(await request.body())
    lora = svc.check_model(obj.get("model"))
    check_limits(obj, svc.limits)
    req, fields = decode(obj)
    ctx = context_of(request, salt=req.cache_salt, lora=lora)
    store = _store(request)
    history: list[ChatMessage] = []
    if req.previous_response_id is not None:
        previous = store.get(ctx.tenant, req.previous_response_id)
        if previous is None:  # unknown, evicted, deleted or never stored: OpenAI's answer
            message = f"Previous response with id '{req.previous_response_id}' not found."
            body = error_body(400, "invalid_request_error", message, "previous_response_not_found")
            body["error"]["param"] = "previous_response_id"
            return JSONResponse(body, 400)
        history = previous.messages()
    history = history + chat_messages(req.input)
    system = (
        [] if req.instructions is None else [ChatMessage(role="system", content=req.instructions)]
    )
    conversation = Conversation(
        system + history,
        tools=function_tools(req.tools),
        tool_choice=tool_choice(req.tool_choice),
        parallel_tool_calls=req.parallel_tool_calls,
        template_variables=req.chat_template_kwargs,
        thinking=req.reasoning.thinking() if req.reasoning is not None else Thinking(),
        named_as="input",
    )
    if not conversation.messages:
        raise BadRequest("input must not be empty (or give previous_response_id)")
    fields.setdefault("max_tokens", svc.engine.context_length)  # the engine caps it there
    field = "max_output_tokens" if req.max_output_tokens is not None else None
    prepared = await pipeline.prepare(
        svc, ctx, ConversationRequest(conversation, sampling_params(fields), field), request
    )
    ids, params, plan = prepared.ids, prepared.params, prepared.plan

    now = int(time.time())
    shell = _shell(req, obj, conversation.tools, svc.reply_model(req.model), now, params)
    writer = _Writer(prepared.reply(), plan.mode if plan is not None else None)

    def finish(finish_reason: str | None, meta: dict[str, Any]) -> dict[str, Any]:
        """The finished response (stored unless `store: false`), once the output has ended."""
        incomplete = finish_reason == "length"
        body = {
            **shell,
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "completed_at": int(time.time()),
            "output": writer.items,
            "usage": _usage(meta),
        }
        if req.store is not False:
            store.put(ctx.tenant, body, history + chat_messages(writer.items, "output"))
        return body

    if req.stream:
        return _event_stream(svc, prepared.stream(ids, params), writer, shell, finish)
    [out] = await unless_disconnected(request, svc.collect_all(prepared.jobs, prepared.stream))
    writer.feed(out.text, out.finish_reason)
    writer.finish(out.finish_reason)
    return _json(finish(out.finish_reason, out.meta))


def _event_stream(
    svc: Service,
    chunks: AsyncIterator[StreamChunk],
    writer: _Writer,
    shell: dict[str, Any],
    finish: Callable[[str | None, dict[str, Any]], dict[str, Any]],
) -> StreamingResponse:
    """The response as server-sent events (`event:` and `data:` lines, no [DONE]): created,
    in_progress, the output's, then completed, incomplete or failed. Admission is checked now
    and held while it runs; a client that leaves cancels it, which aborts the engine request."""
    svc.check_room(1)

    def sse(kind: str, event: dict) -> bytes:
        return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode(event) + b"\n\n"

    async def body():
        with svc.admit(1, checked=True):  # the headers are out: no 503 now
            yield sse(*writer.event("response.created", response=shell))
            yield sse(*writer.event("response.in_progress", response=shell))
            try:
                finish_reason, meta = None, {}
                async for chunk in chunks:
                    for e in writer.feed(chunk.text, chunk.finish_reason):
                        yield sse(*e)
                    if chunk.finish_reason is not None:
                        finish_reason, meta = chunk.finish_reason, chunk.meta or {}
                for e in writer.finish(finish_reason):
                    yield sse(*e)
                done = finish(finish_reason, meta)
                yield sse(*writer.event(f"response.{done['status']}", response=done))
            except Exception as e:  # the request's own parameters, or the engine, failed it
                code = "invalid_prompt" if isinstance(e, BadRequest) else "server_error"
                error = {"code": code, "message": str(e) or type(e).__name__}
                failed = {**shell, "status": "failed", "error": error, "output": writer.items}
                yield sse(*writer.event("response.failed", response=failed))

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


def _shell(
    req: ResponsesRequest,
    obj: dict[str, Any],
    functions: list[Tool] | None,
    model: str,
    created: int,
    params: SamplingParams,
) -> dict[str, Any]:
    """The response object before its output: what the request set, echoed as OpenAI does."""
    text = obj.get("text") if isinstance(obj.get("text"), dict) else {}
    listed = [
        {
            "type": "function",
            "name": t.function.name,
            "description": t.function.description,
            "parameters": t.function.parameters,
            "strict": t.function.strict is not False,
        }
        for t in functions or ()
    ]
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": created,
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": req.max_tool_calls,
        "model": model,
        "output": [],
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {
            "effort": req.reasoning.effort if req.reasoning is not None else None,
            "summary": None,
        },
        "store": req.store is not False,
        "temperature": params.temperature,
        "text": {"format": text.get("format") or {"type": "text"}, "verbosity": "medium"},
        "tool_choice": obj.get("tool_choice") or "auto",
        "tools": listed,
        "top_p": params.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": req.user,
        "metadata": req.metadata or {},
    }


def _store(request: Request) -> ResponseStore:
    """The app's stored responses: app.state.response_store, made with the default bounds on
    first use unless the app was given one."""
    state = request.app.state
    if getattr(state, "response_store", None) is None:
        state.response_store = ResponseStore()
    return state.response_store


def _json(body: dict[str, Any]) -> Response:
    """The body as msgspec encodes it (as the store keeps it): several times faster than
    starlette's json.dumps, which held the event loop for a large response."""
    return Response(msgspec.json.encode(body), media_type="application/json")


def _not_found(response_id: str) -> Response:
    message = f"Response with id '{response_id}' not found."
    return JSONResponse(error_body(404, "invalid_request_error", message), 404)


async def get_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    entry = _store(request).get(context_of(request).tenant, response_id)
    if entry is None:
        return _not_found(response_id)
    # Stored as the JSON it was returned as: written as it is, with nothing encoded on the
    # event loop however large it is.
    return Response(entry.body, media_type="application/json")


async def delete_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    if not _store(request).delete(context_of(request).tenant, response_id):
        return _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


ROUTES = [
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
]
