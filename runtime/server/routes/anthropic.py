"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens, for the anthropic
SDK and Claude-style agents.

A request is translated into the conversation it means, which the conversation pipeline
(chat/pipeline.py) renders, constrains, streams and parses exactly as for /v1/chat/completions.
Only the wire format is Anthropic's: content blocks,
tool_use blocks whose input is an object, stop reasons, usage split into fresh and cached input
tokens, SSE events with `event:` names, and errors as
{"type": "error", "error": {"type": ..., "message": ...}}.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from braid.runtime.config import RequestLimits
from braid.runtime.protocol.sampling_params import SamplingParams
from braid.runtime.server.chat import pipeline, tools
from braid.runtime.server.chat.conversation import Conversation, ConversationRequest
from braid.runtime.server.chat.pipeline import Prepared
from braid.runtime.server.chat.reply import Reply
from braid.runtime.server.http.disconnects import unless_disconnected
from braid.runtime.server.http.limits import check_schema
from braid.runtime.server.request_context import context_of
from braid.runtime.server.service import Overloaded, Service
from braid.runtime.server.wire import (
    BadRequest,
    CacheSalt,
    ChatMessage,
    FunctionCall,
    FunctionDefinition,
    FunctionName,
    ModelNotFound,
    NamedToolChoice,
    Tool,
    ToolCall,
    convert,
    decode_object,
    sampling_params,
)

PATH = "/v1/messages"  # this route and the ones under it answer errors in Anthropic's shape

# ---- wire types ------------------------------------------------------------------------------


class _Block(msgspec.Struct, tag_field="type", kw_only=True, forbid_unknown_fields=True):
    # Prompt caching is automatic here (the radix cache): breakpoints are accepted, unused.
    cache_control: dict[str, Any] | None = None


class TextBlock(_Block, tag="text"):
    text: str
    citations: list[Any] | None = None  # accepted, unused


class ToolUseBlock(_Block, tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


class _Refused(_Block, forbid_unknown_fields=False):
    """A block braid's text-only models cannot read: decoding it is a 400 naming where it is
    (its other fields are not looked at)."""

    def __post_init__(self) -> None:
        kind = self.__struct_config__.tag
        raise ValueError(f"{kind} blocks are not supported: braid serves text-only models")


class ImageBlock(_Refused, tag="image"):
    pass


class DocumentBlock(_Refused, tag="document"):
    pass


class ToolResultBlock(_Block, tag="tool_result"):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock] = ""
    is_error: bool = False


Block = TextBlock | ToolUseBlock | ToolResultBlock | ImageBlock | DocumentBlock


class Message(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["user", "assistant"]  # system text is the request's `system`
    content: str | list[Block]


class ToolDefinition(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    input_schema: dict[str, Any]  # a JSON schema of type object
    description: str | None = None
    # Client tools only: Anthropic's server tools (web search, bash...) run on its servers.
    type: Literal["custom"] = "custom"
    cache_control: dict[str, Any] | None = None  # accepted, unused (see _Block)
    strict: bool | None = None  # accepted: the input always follows the schema here


class ToolChoice(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None  # the tool, for type "tool"
    disable_parallel_tool_use: bool = False


class CountTokensRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The prompt's parts: all /v1/messages/count_tokens takes."""

    # The served model's name; another is a 404 unless the server runs with
    # --accept-any-model. Absent: the served model.
    model: str | None = None
    messages: list[Message]
    system: str | list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = None  # accepted: braid writes no thinking blocks
    cache_control: dict[str, Any] | None = None  # accepted, unused (see _Block)
    # braid's, as on chat completions: variables for the model's chat template (Qwen3's
    # enable_thinking...), never apply_chat_template's own arguments (Service checks).
    chat_template_kwargs: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: Annotated[int, msgspec.Meta(ge=1)]
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None  # accepted, unused (Anthropic's user_id)
    service_tier: str | None = None  # accepted, unused
    cache_salt: CacheSalt | None = None  # braid's (vLLM's name): see wire.CacheSalt


# ---- errors ----------------------------------------------------------------------------------

# The errors a request may cause, as Anthropic answers them (the first that matches). Others
# go on to the app's handlers, which answer in OpenAI's shape (a 500 is logged there).
_ERRORS: list[tuple[type[Exception], int, str]] = [
    (ModelNotFound, 404, "not_found_error"),
    (Overloaded, 529, "overloaded_error"),  # Anthropic's status for it; its SDK retries it
    (ValueError, 400, "invalid_request_error"),  # BadRequest, and the engine's
]


def error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_response(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse(error_body(kind, message), status)


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
                    return error_response(status, name, str(e) or type(e).__name__)
            raise

    return answer


# ---- the request -----------------------------------------------------------------------------


def _check_limits(obj: dict[str, Any], limits: RequestLimits) -> None:
    """The raw body's stop sequences and tool schemas against the server's limits, before it
    is decoded (as check_openai_body does for OpenAI's fields)."""
    stops = obj.get("stop_sequences")
    if isinstance(stops, list):
        if len(stops) > limits.max_stop_strings:
            raise BadRequest(
                f"stop_sequences has {len(stops)} entries; this server allows at most "
                f"{limits.max_stop_strings} (--max-stop-strings)"
            )
        longest = max((len(s) for s in stops if isinstance(s, str)), default=0)
        if longest > limits.max_stop_length:
            raise BadRequest(
                f"stop_sequences has an entry of {longest} characters; this server allows at "
                f"most {limits.max_stop_length} (--max-stop-length)"
            )
    tool_list = obj.get("tools")
    for i, tool in enumerate(tool_list if isinstance(tool_list, list) else []):
        if isinstance(tool, dict) and tool.get("input_schema") is not None:
            check_schema(tool["input_schema"], limits, f"tools[{i}].input_schema")


def _text(blocks: str | list[TextBlock]) -> str:
    # Blocks are separate pieces of text (Claude Code sends a reminder and the user's words as
    # two): a newline keeps them from running together.
    return blocks if isinstance(blocks, str) else "\n".join(b.text for b in blocks)


_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # "tool": a named function


def _conversation(req: CountTokensRequest) -> Conversation:
    """The conversation `req` means, a final assistant message of text its prefill (which
    the reply continues)."""
    if not req.messages:
        raise BadRequest("messages must not be empty")
    turns, prefill = req.messages, ""
    if turns[-1].role == "assistant":
        *turns, last = turns
        if not isinstance(last.content, str) and any(
            not isinstance(b, TextBlock) for b in last.content
        ):
            raise BadRequest(
                "the last message is an assistant's tool_use: answer it with a user message of "
                "tool_result blocks"
            )
        prefill = _text(last.content)
    messages = [ChatMessage(role="system", content=_text(req.system))] if req.system else []
    for i, m in enumerate(turns):
        messages += _chat_messages(m, i)
    functions = [
        Tool("function", FunctionDefinition(t.name, t.description, t.input_schema))
        for t in req.tools or ()
    ]
    choice, tool_choice, parallel = req.tool_choice, None, None
    if choice is not None:
        if choice.type == "tool":
            if choice.name is None:
                raise BadRequest("tool_choice of type 'tool' needs the tool's name")
            tool_choice = NamedToolChoice("function", FunctionName(choice.name))
        else:
            tool_choice = _TOOL_CHOICES[choice.type]
        parallel = not choice.disable_parallel_tool_use
    return Conversation(
        messages,
        tools=functions or None,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        template_variables=req.chat_template_kwargs,
        prefill=prefill,
    )


def _chat_messages(m: Message, i: int) -> list[ChatMessage]:
    """One Anthropic message as chat messages: an assistant's text and calls as one; a user's
    tool results as tool messages, then its text (Anthropic puts the results first, and a chat
    template wants them right after the calls they answer)."""
    if isinstance(m.content, str):
        return [ChatMessage(role=m.role, content=m.content)]
    texts, calls, results = [], [], []
    for block in m.content:
        if isinstance(block, TextBlock):
            texts.append(block)
        elif isinstance(block, ToolUseBlock):
            if m.role != "assistant":
                raise BadRequest(f"messages[{i}]: tool_use blocks belong in assistant messages")
            arguments = json.dumps(block.input, ensure_ascii=False)
            calls.append(ToolCall(id=block.id, function=FunctionCall(block.name, arguments)))
        else:  # a tool_result (the other kinds were refused when decoded)
            if m.role != "user":
                raise BadRequest(f"messages[{i}]: tool_result blocks belong in user messages")
            content = _text(block.content)
            if block.is_error:  # what the model needs to know of it
                content = f"Error: {content}"
            results.append(
                ChatMessage(role="tool", tool_call_id=block.tool_use_id, content=content)
            )
    if m.role == "assistant":
        return [ChatMessage(role="assistant", content=_text(texts), tool_calls=calls or None)]
    texts_message = [ChatMessage(role="user", content=_text(texts))]
    return results + (texts_message if texts or not results else [])


def _sampling(req: MessagesRequest) -> SamplingParams:
    fields = {
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "stop": req.stop_sequences,
    }
    return sampling_params({k: v for k, v in fields.items() if v is not None})


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


def _usage(meta: dict[str, Any]) -> dict[str, int]:
    """Anthropic counts the input read from the cache apart from the rest."""
    prompt = meta.get("prompt_tokens", 0)
    # The engine counts tokens a constraint forces at the start, found in the cache with the
    # prompt, as cached prompt tokens: they are not input.
    cached = min(meta.get("cached_tokens", 0), prompt)
    return {
        "input_tokens": prompt - cached,
        "output_tokens": meta.get("completion_tokens", 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


class _Blocks:
    """Streamed output as content-block events: text deltas in a text block; each call a
    tool_use block whose input arrives as pieces of JSON."""

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
            if kind == "text":
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
        self.open = None
        return [("content_block_stop", {"index": self.num_blocks - 1})]


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
                yield _event("error", error_body("invalid_request_error", str(e)))
            except Exception as e:
                yield _event("error", error_body("api_error", str(e)))

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


# ---- the routes ------------------------------------------------------------------------------


@_anthropic_errors
async def messages(request: Request) -> Response:
    svc: Service = request.app.state.service
    obj = decode_object(await request.body())
    _check_limits(obj, svc.limits)
    req = convert(obj, MessagesRequest)
    ctx = context_of(request, salt=req.cache_salt, lora=svc.check_model(req.model))
    # As on Anthropic's newer models, a max_tokens past the context's end is not refused: the
    # reply stops there (so an agent may ask for the most without counting its prompt).
    conversation = ConversationRequest(_conversation(req), _sampling(req), fit_max_tokens=True)
    prepared = await pipeline.prepare(svc, ctx, conversation)
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
    if reply.calls:
        content = [_tool_use(call, whole=True) for call in reply.calls]
    else:
        content = [{"type": "text", "text": out.text}] if out.text else []
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
    _check_limits(obj, svc.limits)
    req = convert(obj, CountTokensRequest)
    svc.check_model(req.model)
    prompt, _ = await pipeline.prompt(svc, _conversation(req))
    return JSONResponse({"input_tokens": len(prompt)})


ROUTES = [
    Route(PATH, messages, methods=["POST"]),
    Route(PATH + "/count_tokens", count_tokens, methods=["POST"]),
]
