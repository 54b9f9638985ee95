"""Anthropic's Messages API request (/v1/messages, /v1/messages/count_tokens) and its
translation into chat terms: content blocks as chat messages (thinking blocks an assistant's
reasoning_content), tools and tool_choice as chat's, `thinking` as the request's Thinking,
output_config.format as a json_schema constraint."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import msgspec

from braid.runtime.config import RequestLimits
from braid.runtime.protocol.sampling_params import SamplingParams
from braid.runtime.server.chat.conversation import Conversation
from braid.runtime.server.chat.reasoning_fields import Thinking
from braid.runtime.server.http.limits import check_schema
from braid.runtime.server.wire import (
    BadRequest,
    CacheSalt,
    ChatMessage,
    FunctionCall,
    FunctionDefinition,
    FunctionName,
    NamedToolChoice,
    Tool,
    ToolCall,
    sampling_params,
)

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


class ThinkingBlock(_Block, tag="thinking"):
    """A thought in an assistant's turn: its reasoning_content. Signatures are accepted and
    not checked (braid's are empty)."""

    thinking: str
    signature: str | None = None


class _Refused(_Block, forbid_unknown_fields=False):
    """A block braid cannot read: decoding it is a 400 naming where it is (its other fields
    are not looked at)."""

    why = "braid serves text-only models"

    def __post_init__(self) -> None:
        kind = self.__struct_config__.tag
        raise ValueError(f"{kind} blocks are not supported: {self.why}")


class ImageBlock(_Refused, tag="image"):
    pass


class DocumentBlock(_Refused, tag="document"):
    pass


class RedactedThinkingBlock(_Refused, tag="redacted_thinking"):
    why = "their thought is encrypted by another server, and braid's are never redacted"


class ToolResultBlock(_Block, tag="tool_result"):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock] = ""
    is_error: bool = False


Block = (
    TextBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | ImageBlock
    | DocumentBlock
    | RedactedThinkingBlock
)


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


class ThinkingConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`thinking`: enabled with a budget, disabled (thinking off), or adaptive (the model's
    own default). display "omitted" leaves the thought out of the reply."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None
    display: Literal["summarized", "omitted"] | None = None

    def thinking(self) -> Thinking:
        if (self.type == "enabled") != (self.budget_tokens is not None):
            raise BadRequest("thinking.budget_tokens goes with thinking of type 'enabled' (only)")
        budget = 0 if self.type == "disabled" else self.budget_tokens
        field = "thinking.budget_tokens" if self.type == "enabled" else "thinking.type"
        return Thinking(budget=budget, budget_field=field, include=self.display != "omitted")


class JsonOutputFormat(msgspec.Struct, forbid_unknown_fields=True, rename={"schema_": "schema"}):
    type: Literal["json_schema"]
    schema_: dict[str, Any]


class OutputConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    format: JsonOutputFormat | None = None  # the reply's text is JSON valid under the schema


class CountTokensRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The prompt's parts: all /v1/messages/count_tokens takes."""

    # The served model's name; another is a 404 unless the server runs with
    # --accept-any-model. Absent: the served model.
    model: str | None = None
    messages: list[Message]
    system: str | list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
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
    output_config: OutputConfig | None = None
    # A message thread (the SDK's tool runner opens one): braid keeps none, and answers as
    # Anthropic does a request it cannot thread (ThreadUnsupported). False or null: none.
    thread: dict[str, Any] | bool | None = None


class ThreadUnsupported(BadRequest):
    """A request that asks for a message thread: a 400 whose error details say that it
    cannot be threaded (`thread_unsupported_request`), as Anthropic answers a request it
    cannot thread. The SDK's tool runner then sends that turn and the later ones with the
    whole history and no thread."""

    details = {"error_code": "thread_unsupported_request", "unsupported": ["thread"]}

    def __init__(self) -> None:
        super().__init__(
            "thread: this server keeps no message threads; send the whole history in "
            "messages, without thread"
        )


def check_thread(req: MessagesRequest) -> None:
    if req.thread is not None and req.thread is not False:
        raise ThreadUnsupported()


# ---- into chat terms -----------------------------------------------------------------------------


def check_limits(obj: dict[str, Any], limits: RequestLimits) -> None:
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
    output = obj.get("output_config")
    output_format = output.get("format") if isinstance(output, dict) else None
    if isinstance(output_format, dict) and output_format.get("schema") is not None:
        check_schema(output_format["schema"], limits, "output_config.format.schema")


def _text(blocks: str | list[TextBlock]) -> str:
    # Blocks are separate pieces of text (Claude Code sends a reminder and the user's words as
    # two): a newline keeps them from running together.
    return blocks if isinstance(blocks, str) else "\n".join(b.text for b in blocks)


_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # "tool": a named function


def conversation(req: CountTokensRequest) -> Conversation:
    """The conversation `req` means, a final assistant message of text its prefill (which
    the reply continues)."""
    if not req.messages:
        raise BadRequest("messages must not be empty")
    turns, prefill = req.messages, ""
    if turns[-1].role == "assistant":
        *turns, last = turns
        if not isinstance(last.content, str) and any(
            isinstance(b, ToolUseBlock) for b in last.content
        ):
            raise BadRequest(
                "the last message is an assistant's tool_use: answer it with a user message of "
                "tool_result blocks"
            )
        if not isinstance(last.content, str) and any(
            not isinstance(b, TextBlock) for b in last.content
        ):
            raise BadRequest(
                "the last message is a prefill, which the reply continues: it holds text "
                "blocks only (a thought cannot be continued)"
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
        thinking=req.thinking.thinking() if req.thinking is not None else Thinking(),
        prefill=prefill,
    )


def _chat_messages(m: Message, i: int) -> list[ChatMessage]:
    """One Anthropic message as chat messages: an assistant's text and calls as one; a user's
    tool results as tool messages, then its text (Anthropic puts the results first, and a chat
    template wants them right after the calls they answer)."""
    if isinstance(m.content, str):
        return [ChatMessage(role=m.role, content=m.content)]
    texts, calls, results, thoughts = [], [], [], []
    for block in m.content:
        if isinstance(block, TextBlock):
            texts.append(block)
        elif isinstance(block, ThinkingBlock):
            if m.role != "assistant":
                raise BadRequest(f"messages[{i}]: thinking blocks belong in assistant messages")
            thoughts.append(block.thinking)
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
        thought = "\n".join(thoughts) if thoughts else None
        message = ChatMessage(
            role="assistant",
            content=_text(texts),
            tool_calls=calls or None,
            reasoning_content=thought,
        )
        return [message]
    texts_message = [ChatMessage(role="user", content=_text(texts))]
    return results + (texts_message if texts or not results else [])


def sampling(req: MessagesRequest) -> SamplingParams:
    output_format = req.output_config.format if req.output_config is not None else None
    fields = {
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "stop": req.stop_sequences,
        "json_schema": output_format.schema_ if output_format is not None else None,
    }
    return sampling_params({k: v for k, v in fields.items() if v is not None})
