"""The Responses API's request (/v1/responses) and its translation into chat terms: the
input items as chat messages, the function tools and tool_choice as chat's."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from braid.runtime.config import RequestLimits
from braid.runtime.server.chat.reasoning_fields import Thinking, effort_budget
from braid.runtime.server.http.limits import check_fields, check_schema
from braid.runtime.server.wire import (
    REASONING_FIELDS,
    BadRequest,
    CacheSalt,
    ChatMessage,
    FunctionCall,
    FunctionDefinition,
    FunctionName,
    NamedToolChoice,
    Tool,
    ToolCall,
    check_healing,
    convert,
    split_sampling,
)

# ---- the request -----------------------------------------------------------------------------


class _Strict(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class FunctionTool(_Strict):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; absent: no parameters
    strict: bool | None = None  # accepted: arguments always follow the schema here


class TextFormat(_Strict, rename={"schema_": "schema"}):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None  # the only one a non-reasoning model has


class Reasoning(_Strict):
    effort: str | None = None  # a thinking budget (reasoning_fields.EFFORT_BUDGETS)
    summary: str | None = None
    generate_summary: str | None = None  # the older name of summary

    def __post_init__(self) -> None:
        # The thought comes back as it is (reasoning_text), never summarized.
        for name in ("summary", "generate_summary"):
            if getattr(self, name) is not None:
                raise ValueError(
                    f"reasoning.{name}: braid writes no summaries of the thought (its reasoning "
                    "items carry the thought itself); give null"
                )

    def thinking(self) -> Thinking:
        budget = effort_budget("reasoning.effort", self.effort)
        return Thinking(budget=budget, budget_field="reasoning.effort", effort=self.effort)


class StreamOptions(_Strict):
    include_obfuscation: bool | None = None  # accepted: braid pads no events


# The `include` entries accepted: reasoning items carry their text, never encrypted.
_INCLUDABLE = frozenset({"reasoning.encrypted_content"})

# OpenAI's bounds on `metadata` (its Metadata object: at most 16 pairs, keys at most 64
# characters, values strings of at most 512): echoed and stored with the response, unbounded
# it made every stored response as large as the request body allows.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512


def _check_metadata(metadata: dict[str, str] | None) -> None:
    """A ValueError naming `metadata` where it is past OpenAI's bounds (its values' type,
    strings, is the decoder's to check)."""
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise ValueError(
            f"metadata: at most {MAX_METADATA_PAIRS} key-value pairs, got {len(metadata)}"
        )
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise ValueError(
                f"metadata: keys are at most {MAX_METADATA_KEY_CHARS} characters, "
                f"{key[:MAX_METADATA_KEY_CHARS]!r}... has {len(key)}"
            )
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise ValueError(
                f"metadata[{key!r}]: values are at most {MAX_METADATA_VALUE_CHARS} characters, "
                f"got {len(value)}"
            )


class ResponsesRequest(_Strict):
    model: str | None = None  # the served model's name, or absent (see openai_routes)
    input: str | list[Any] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None  # absent: the rest of the context
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # None: OpenAI's default, true
    text: TextConfig | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    previous_response_id: str | None = None
    store: bool | None = None  # None: OpenAI's default, true
    metadata: dict[str, str] | None = None
    user: str | None = None
    reasoning: Reasoning | None = None
    truncation: str | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    background: bool | None = None
    max_tool_calls: int | None = None  # accepted: it bounds built-in tools, braid has none
    cache_salt: CacheSalt | None = None  # braid's (vLLM's name): see wire.CacheSalt
    # braid's, as on chat completions: variables for the model's chat template (Qwen3's
    # enable_thinking...), never apply_chat_template's own arguments (Service checks).
    chat_template_kwargs: dict[str, Any] | None = None
    # Sent by OpenAI clients and agent frameworks; accepted and unused here.
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None

    def __post_init__(self) -> None:
        _check_metadata(self.metadata)
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            raise ValueError("max_output_tokens must be >= 1")
        if refused := sorted(set(self.include or ()) - _INCLUDABLE):
            raise ValueError(f"include: {', '.join(refused)} is not supported on braid")
        if self.truncation not in (None, "disabled"):
            raise ValueError(
                "truncation: only 'disabled' is supported (braid never drops input to fit the "
                "context: a prompt too long is a 400)"
            )
        if self.top_logprobs:
            raise ValueError(
                "top_logprobs: /v1/responses reports no logprobs on braid (use "
                "/v1/chat/completions)"
            )
        if self.background:
            raise ValueError("background: braid answers within the request (give false)")


# SamplingParams fields that have no place in a Responses request.
_NOT_HERE = {"max_tokens": "use max_output_tokens", "n": "a response has one output"}


def decode(obj: dict[str, Any]) -> tuple[ResponsesRequest, dict[str, Any]]:
    """The request and its sampling fields: temperature and top_p, and braid's own sampling
    fields (seed, top_k, stop, logit_bias, ...) as on /v1/chat/completions."""
    # `reasoning` is the Responses API's own object; braid's thinking fields are chat's.
    fields, rest = split_sampling(obj, REASONING_FIELDS)
    if fields.get("token_healing"):
        check_healing(None)
    for name, instead in _NOT_HERE.items():
        if name in fields:
            raise BadRequest(f"{name} is not a Responses API field: {instead}")
    req = convert(rest, ResponsesRequest)
    if req.max_output_tokens is not None:
        fields["max_tokens"] = req.max_output_tokens
    text_format = req.text.format if req.text is not None else None
    if text_format is not None and text_format.type == "json_schema":
        if text_format.schema_ is None:
            raise BadRequest("text.format json_schema needs a schema")
        fields["json_schema"] = text_format.schema_
    elif text_format is not None and text_format.type == "json_object":
        fields["json_schema"] = {"type": "object"}
    return req, fields


def check_limits(obj: dict[str, Any], limits: RequestLimits) -> None:
    """The body's sampling fields, text.format's schema and each tool's parameters against
    the server's limits, before anything is decoded."""
    check_fields(obj, limits)
    text = obj.get("text")
    text_format = text.get("format") if isinstance(text, dict) else None
    if isinstance(text_format, dict) and text_format.get("schema") is not None:
        check_schema(text_format["schema"], limits, "text.format.schema")
    listed = obj.get("tools")
    for i, tool in enumerate(listed if isinstance(listed, list) else []):
        if isinstance(tool, dict) and tool.get("parameters") is not None:
            check_schema(tool["parameters"], limits, f"tools[{i}].parameters")


def function_tools(listed: list[Any] | None) -> list[Tool] | None:
    """The function tools as chat's; another type of tool (web_search, file_search, mcp...)
    is a 400 naming it."""
    if not listed:
        return None
    out = []
    for i, raw in enumerate(listed):
        kind = raw.get("type") if isinstance(raw, dict) else None
        if kind != "function":
            raise BadRequest(
                f"tools[{i}]: tools of type {kind!r} are not supported on braid (only 'function')"
            )
        t = _convert(raw, FunctionTool, f"tools[{i}]")
        function = FunctionDefinition(t.name, t.description, t.parameters, t.strict)
        out.append(Tool("function", function))
    return out


def tool_choice(choice: str | dict[str, Any] | None) -> Any:
    """tool_choice as chat's: "none", "auto", "required" or {"type": "function", "name": N}."""
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        if set(choice) != {"type", "name"} or not isinstance(choice["name"], str):
            raise BadRequest('tool_choice: a function is {"type": "function", "name": NAME}')
        return NamedToolChoice("function", FunctionName(choice["name"]))
    kind = choice.get("type") if isinstance(choice, dict) else choice
    raise BadRequest(
        f"tool_choice {kind!r} is not supported on braid: give 'none', 'auto', 'required' or "
        '{"type": "function", "name": NAME}'
    )


def _convert(obj: Any, kind: type, where: str) -> Any:
    """convert, its message's path (`$...`) named from `where`."""
    try:
        return msgspec.convert(obj, kind)
    except (msgspec.ValidationError, ValueError) as e:
        raise BadRequest(f"{where}: {e}".replace("`$", f"`{where}")) from None


# ---- input items: the conversation -----------------------------------------------------------


class _Item(_Strict, tag_field="type"):
    pass


class InputText(_Item, tag="input_text"):
    text: str
    prompt_cache_breakpoint: Any = None


class OutputText(_Item, tag="output_text"):
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class Refusal(_Item, tag="refusal"):
    refusal: str

    @property
    def text(self) -> str:
        return self.refusal


class Message(_Item, tag="message"):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText | OutputText | Refusal]
    id: str | None = None
    status: str | None = None
    phase: str | None = None

    def add_to(self, messages: list[ChatMessage]) -> None:
        content = self.content
        if not isinstance(content, str):
            content = "".join(part.text for part in content)
        if self.role == "assistant" and _thought_only(messages):  # a reasoning item's answer
            messages[-1] = msgspec.structs.replace(messages[-1], content=content)
        else:
            messages.append(ChatMessage(role=self.role, content=content))


class ReasoningText(_Item, tag="reasoning_text"):
    text: str


class SummaryText(_Item, tag="summary_text"):
    text: str


class ReasoningItem(_Item, tag="reasoning"):
    """A thought the model had (a reasoning output item given back): the reasoning_content
    of the assistant message that follows it (its text, or its calls)."""

    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None
    id: str | None = None
    status: str | None = None
    encrypted_content: str | None = None  # another server's: braid cannot read it

    def add_to(self, messages: list[ChatMessage]) -> None:
        parts = self.content if self.content else self.summary
        thought = "".join(part.text for part in parts)
        messages.append(ChatMessage(role="assistant", reasoning_content=thought))


def _thought_only(messages: list[ChatMessage]) -> bool:
    """The last message is a reasoning item's, waiting for the answer it goes with."""
    last = messages[-1] if messages else None
    return (
        last is not None
        and last.role == "assistant"
        and last.reasoning_content is not None
        and last.content is None
        and not last.tool_calls
    )


class FunctionCallItem(_Item, tag="function_call", rename={"async_": "async"}):
    call_id: str
    name: str
    arguments: str  # JSON text
    id: str | None = None
    status: str | None = None
    namespace: str | None = None
    caller: Any = None
    async_: bool | None = None

    def add_to(self, messages: list[ChatMessage]) -> None:
        """An assistant's tool call: parallel calls (and the text before them) are one
        assistant message, as in a chat conversation."""
        call = ToolCall(id=self.call_id, function=FunctionCall(self.name, self.arguments))
        if messages and messages[-1].role == "assistant":
            last = messages[-1]
            calls = [*(last.tool_calls or ()), call]
            messages[-1] = msgspec.structs.replace(last, tool_calls=calls)
        else:
            messages.append(ChatMessage(role="assistant", tool_calls=[call]))


class FunctionCallOutputItem(_Item, tag="function_call_output"):
    call_id: str
    output: str | list[InputText]
    id: str | None = None
    status: str | None = None
    name: str | None = None
    namespace: str | None = None
    caller: Any = None

    def add_to(self, messages: list[ChatMessage]) -> None:
        output = self.output
        if not isinstance(output, str):
            output = "".join(part.text for part in output)
        messages.append(ChatMessage(role="tool", tool_call_id=self.call_id, content=output))


InputItem = Message | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
# Each kind of item taken: the field holding its content parts, and the kinds of part taken.
_PARTS = {
    "message": ("content", ("input_text", "output_text", "refusal")),
    "function_call": None,
    "function_call_output": ("output", ("input_text",)),
    "reasoning": ("content", ("reasoning_text",)),
}


def chat_messages(items: str | list[Any] | None, where: str = "input") -> list[ChatMessage]:
    """The items as chat messages (a reasoning item's thought the reasoning_content of the
    assistant message after it). Another kind of item (item_reference, built-in tool calls)
    or of content (images, files, audio: braid serves text models) is a 400 naming it."""
    if items is None:
        return []
    if isinstance(items, str):
        return [ChatMessage(role="user", content=items)]
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequest(f"{where}[{i}] must be an object")
        if "type" not in item and "role" in item:  # an "easy" message
            item["type"] = "message"
        kind = item.get("type")
        if kind not in _PARTS:
            raise BadRequest(
                f"{where}[{i}]: items of type {kind!r} are not supported on braid (it takes "
                "message, function_call, function_call_output and reasoning items)"
            )
        field, taken = _PARTS[kind] or ("", ())
        parts = item.get(field)
        for j, part in enumerate(parts if isinstance(parts, list) else []):
            part_kind = part.get("type") if isinstance(part, dict) else None
            if part_kind not in taken:
                raise BadRequest(
                    f"{where}[{i}].{field}[{j}]: {part_kind!r} content is not supported on "
                    f"braid, which serves text-only models ({', '.join(taken)})"
                )
    messages: list[ChatMessage] = []
    for item in _convert(items, list[InputItem], where):
        item.add_to(messages)
    return messages
