"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens, for the anthropic
SDK and Claude-style agents.

A request is translated into the chat-completions request it means (a ChatCompletionRequest),
so its prompt is rendered, its tools planned and constrained and its calls parsed exactly as on
/v1/chat/completions (server/tools.py). Only the wire format is Anthropic's: content blocks,
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
from braid.runtime.server.chat import tools
from braid.runtime.server.http.disconnects import unless_disconnected
from braid.runtime.server.http.limits import check_schema
from braid.runtime.server.service import REQUEST_LORA, REQUEST_SALT, Overloaded, Service
from braid.runtime.server.wire import (
    BadRequest,
    CacheSalt,
    ChatCompletionRequest,
    ModelNotFound,
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


def _chat_request(req: CountTokensRequest) -> tuple[ChatCompletionRequest, str]:
    """The chat-completions request `req` means, and the text of its final assistant message
    (a prefill, which the reply continues) if it ends with one."""
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
    messages = [{"role": "system", "content": _text(req.system)}] if req.system else []
    for i, m in enumerate(turns):
        messages += _chat_messages(m, i)
    body: dict[str, Any] = {"messages": messages}
    if req.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.input_schema,
                },
            }
            for t in req.tools
        ]
    choice = req.tool_choice
    if choice is not None:
        if choice.type == "tool":
            if choice.name is None:
                raise BadRequest("tool_choice of type 'tool' needs the tool's name")
            body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            body["tool_choice"] = _TOOL_CHOICES[choice.type]
        body["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    return convert(body, ChatCompletionRequest), prefill


def _chat_messages(m: Message, i: int) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: an assistant's text and calls as one; a user's
    tool results as tool messages, then its text (Anthropic puts the results first, and a chat
    template wants them right after the calls they answer)."""
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    texts, calls, results = [], [], []
    for block in m.content:
        if isinstance(block, TextBlock):
            texts.append(block)
        elif isinstance(block, ToolUseBlock):
            if m.role != "assistant":
                raise BadRequest(f"messages[{i}]: tool_use blocks belong in assistant messages")
            arguments = json.dumps(block.input, ensure_ascii=False)
            function = {"name": block.name, "arguments": arguments}
            calls.append({"id": block.id, "type": "function", "function": function})
        else:  # a tool_result (the other kinds were refused when decoded)
            if m.role != "user":
                raise BadRequest(f"messages[{i}]: tool_result blocks belong in user messages")
            content = _text(block.content)
            if block.is_error:  # what the model needs to know of it
                content = f"Error: {content}"
            results.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": content})
    if m.role == "assistant":
        message: dict[str, Any] = {"role": "assistant", "content": _text(texts)}
        return [message | {"tool_calls": calls}] if calls else [message]
    return results + ([{"role": "user", "content": _text(texts)}] if texts or not results else [])


async def _prompt(
    request: Request, req: CountTokensRequest
) -> tuple[list[int], tools.ToolPlan | None]:
    """The prompt's token ids, the conversation rendered by the chat template as
    /v1/chat/completions renders it (tools, calls and results included) and a prefill
    appended; and the request's tool plan."""
    svc: Service = request.app.state.service
    chat, prefill = _chat_request(req)
    plan = tools.plan(chat)
    if prefill and plan is not None and plan.calls:
        raise BadRequest(
            "a final assistant message (a prefill) cannot be continued while the reply may "
            "call tools: give tool_choice {'type': 'none'} or leave the prefill out"
        )
    # Tools and calls too (tools.rendered_chars), before anything is rendered.
    svc.check_text_length(tools.rendered_chars(chat) + len(prefill), "messages")
    ids = await svc.render_conversation(chat)
    if prefill:
        tokenizer = svc.engine.tokenizer
        ids += await svc.off_loop(
            functools.partial(tokenizer.encode, prefill, add_special_tokens=False)
        )
    return ids, plan


def _sampling(req: MessagesRequest, max_tokens: int) -> SamplingParams:
    fields = {
        "max_tokens": max_tokens,
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
        self,
        engine_reason: str | None,
        parser: tools.CallParser | None,
        text: str,
        token_ids: list[int],
    ) -> tuple[str, str | None]:
        """The stop_reason and stop_sequence of an output the engine ended for
        `engine_reason`. The engine cuts the output before a stop string without saying
        which one matched: it is the first one the output's tokens spell past the text."""
        if parser is not None and tools.finish_reason(parser, engine_reason) == "tool_calls":
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

    def __init__(self, parser: tools.CallParser | None) -> None:
        self.parser = parser
        self.num_blocks = 0
        self.open: str | None = None  # the type of the block open, the last one

    def feed(self, text: str) -> list[tuple[str, dict[str, Any]]]:
        return self._events(self.parser.feed(text) if self.parser else [("text", text)])

    def finish(self) -> list[tuple[str, dict[str, Any]]]:
        events = self._events(self.parser.finish() if self.parser else [])
        return events + self._close()

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
                events += self._start(_tool_use(self.parser.calls[rest[0]], whole=False))
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
    svc: Service,
    ids: list[int],
    params: SamplingParams,
    head: dict[str, Any],
    parser: tools.CallParser | None,
    ending: _Ending,
) -> StreamingResponse:
    """The reply as Anthropic's events. Admission is checked now and held while it streams;
    a client that disconnects cancels it, which aborts the engine request. Once the response
    has started, an error can only be an `error` event."""
    svc.check_room(1)

    async def body() -> AsyncIterator[bytes]:
        with svc.admit(1, checked=True):  # the headers are out: no 529 now
            # The cached part of the prompt is known at the end: message_delta has the split.
            usage = {"input_tokens": len(ids), "output_tokens": 0}
            start = {"content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
            yield _event("message_start", {"message": head | start})
            blocks = _Blocks(parser)
            text, token_ids = [], []
            try:
                async for chunk in svc.stream(ids, params):
                    text.append(chunk.text)
                    token_ids += chunk.token_ids
                    for name, data in blocks.feed(chunk.text):
                        yield _event(name, data)
                for name, data in blocks.finish():
                    yield _event(name, data)
                reason, sequence = ending.reason(
                    chunk.finish_reason, parser, "".join(text), token_ids
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
    REQUEST_LORA.set(svc.check_model(req.model))
    REQUEST_SALT.set(req.cache_salt)
    svc.check_room(1)
    prompt, plan = await _prompt(request, req)
    ids = await svc.encode(prompt)  # checked against the context and --max-prompt-tokens
    # As on Anthropic's newer models, a max_tokens past the context's end is not refused: the
    # reply stops there (so an agent may ask for the most without counting its prompt).
    room = svc.engine.context_length - len(ids)
    params = _sampling(req, min(req.max_tokens, room))
    calling = plan is not None and plan.calls  # the output may be calls: constrained, parsed
    if calling:
        params = await tools.constrain(svc, plan, params)
    await svc.check_params(params)
    stops = params.stop  # as tools.constrain left them (none where the reply is calls)
    ending = _Ending(
        svc.engine.tokenizer,
        [stops] if isinstance(stops, str) else list(stops or []),
        "max_tokens" if req.max_tokens <= room else "model_context_window_exceeded",
    )
    head = {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": svc.reply_model(req.model),
    }
    if req.stream:
        return _stream(svc, ids, params, head, tools.CallParser() if calling else None, ending)

    [out] = await unless_disconnected(request, svc.collect_all([(ids, params)]))
    parser = tools.parse(out.text) if calling else None
    if parser is not None and parser.calls:
        content = [_tool_use(call, whole=True) for call in parser.calls]
    else:
        content = [{"type": "text", "text": out.text}] if out.text else []
    reason, sequence = ending.reason(out.finish_reason, parser, out.text, out.token_ids)
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
    prompt, _ = await _prompt(request, req)
    return JSONResponse({"input_tokens": len(prompt)})


ROUTES = [
    Route(PATH, messages, methods=["POST"]),
    Route(PATH + "/count_tokens", count_tokens, methods=["POST"]),
]
