"""The bodies of the two agent APIs, the Responses API's and Anthropic's Messages API, and the
events they stream (each named after its data's `type`), as Structs that /openapi.json
declares: written from routes/responses.py and routes/anthropic.py, as openapi_bodies.py's
are from their routes."""

from __future__ import annotations

from typing import Any, Literal

from msgspec import UNSET, UnsetType

from braid.runtime.server.openapi_bodies import AnthropicError, Body, Typed

# ---- the Responses API -----------------------------------------------------------------------

ItemStatus = Literal["in_progress", "completed", "incomplete"]


class ReasoningText(Typed, tag="reasoning_text"):
    text: str


class OutputText(Typed, tag="output_text"):
    text: str
    annotations: list[Any]
    logprobs: list[Any]


class ReasoningItem(Typed, tag="reasoning"):
    id: str
    status: ItemStatus
    summary: list[Any]
    content: list[ReasoningText]
    encrypted_content: None


class MessageItem(Typed, tag="message"):
    id: str
    status: ItemStatus
    role: Literal["assistant"]
    content: list[OutputText]


class FunctionCallItem(Typed, tag="function_call"):
    id: str
    status: ItemStatus
    arguments: str
    call_id: str
    name: str


OutputItem = ReasoningItem | MessageItem | FunctionCallItem


class ResponseError(Body):
    code: str
    message: str


class IncompleteDetails(Body):
    reason: Literal["max_output_tokens"]


class ReasoningSettings(Body):
    effort: str | None
    summary: None


class TextSettings(Body):
    format: dict[str, Any]
    verbosity: str


class FunctionToolOut(Body):
    type: Literal["function"]
    name: str
    description: str | None
    parameters: dict[str, Any] | None
    strict: bool


class InputTokensDetails(Body):
    cached_tokens: int
    cache_write_tokens: int


class OutputTokensDetails(Body):
    reasoning_tokens: int


class ResponseUsage(Body):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseObject(Body):
    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    background: bool
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    max_tool_calls: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: ReasoningSettings
    store: bool
    temperature: float
    text: TextSettings
    tool_choice: str | dict[str, Any]  # as the request gave it
    tools: list[FunctionToolOut]
    top_p: float
    truncation: Literal["disabled"]
    usage: ResponseUsage | None
    user: str | None
    metadata: dict[str, str]
    completed_at: int | UnsetType = UNSET  # once it has ended


class DeletedResponse(Body):
    id: str
    object: Literal["response"]
    deleted: Literal[True]


class _ResponseEvent(Typed):
    sequence_number: int


class _Lifecycle(_ResponseEvent):
    response: ResponseObject


class ResponseCreated(_Lifecycle, tag="response.created"):
    pass


class ResponseInProgress(_Lifecycle, tag="response.in_progress"):
    pass


class ResponseCompleted(_Lifecycle, tag="response.completed"):
    pass


class ResponseIncomplete(_Lifecycle, tag="response.incomplete"):
    pass


class ResponseFailed(_Lifecycle, tag="response.failed"):
    pass


class _ItemEvent(_ResponseEvent):
    output_index: int
    item: OutputItem


class OutputItemAdded(_ItemEvent, tag="response.output_item.added"):
    pass


class OutputItemDone(_ItemEvent, tag="response.output_item.done"):
    pass


class _AtContent(_ResponseEvent):
    item_id: str
    output_index: int
    content_index: int


class ContentPartAdded(_AtContent, tag="response.content_part.added"):
    part: ReasoningText | OutputText


class ContentPartDone(_AtContent, tag="response.content_part.done"):
    part: ReasoningText | OutputText


class ReasoningTextDelta(_AtContent, tag="response.reasoning_text.delta"):
    delta: str


class ReasoningTextDone(_AtContent, tag="response.reasoning_text.done"):
    text: str


class OutputTextDelta(_AtContent, tag="response.output_text.delta"):
    delta: str
    logprobs: list[Any]


class OutputTextDone(_AtContent, tag="response.output_text.done"):
    text: str
    logprobs: list[Any]


class _AtCall(_ResponseEvent):
    item_id: str
    output_index: int


class FunctionCallArgumentsDelta(_AtCall, tag="response.function_call_arguments.delta"):
    delta: str


class FunctionCallArgumentsDone(_AtCall, tag="response.function_call_arguments.done"):
    arguments: str


RESPONSE_EVENTS = (
    ResponseCreated,
    ResponseInProgress,
    ResponseCompleted,
    ResponseIncomplete,
    ResponseFailed,
    OutputItemAdded,
    OutputItemDone,
    ContentPartAdded,
    ContentPartDone,
    ReasoningTextDelta,
    ReasoningTextDone,
    OutputTextDelta,
    OutputTextDone,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
)

# ---- Anthropic's Messages API ----------------------------------------------------------------


class AnthropicText(Typed, tag="text"):
    text: str


class AnthropicThinking(Typed, tag="thinking"):
    thinking: str
    signature: str


class AnthropicToolUse(Typed, tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


AnthropicBlock = AnthropicThinking | AnthropicText | AnthropicToolUse
StopReason = Literal[
    "end_turn", "max_tokens", "stop_sequence", "tool_use", "model_context_window_exceeded"
]


class ThinkingTokens(Body):
    thinking_tokens: int


class AnthropicUsage(Body):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    output_tokens_details: ThinkingTokens


class AnthropicMessage(Typed, tag="message"):
    id: str
    role: Literal["assistant"]
    model: str
    content: list[AnthropicBlock]
    stop_reason: StopReason
    stop_sequence: str | None
    usage: AnthropicUsage


class StartUsage(Body):
    input_tokens: int
    output_tokens: int


class StartedMessage(Typed, tag="message"):
    """message_start's message: nothing of the output yet."""

    id: str
    role: Literal["assistant"]
    model: str
    content: list[AnthropicBlock]
    stop_reason: None
    stop_sequence: None
    usage: StartUsage


class TokenCount(Body):
    input_tokens: int


class MessageStart(Typed, tag="message_start"):
    message: StartedMessage


class ContentBlockStart(Typed, tag="content_block_start"):
    index: int
    content_block: AnthropicBlock


class TextDelta(Typed, tag="text_delta"):
    text: str


class ThinkingDelta(Typed, tag="thinking_delta"):
    thinking: str


class SignatureDelta(Typed, tag="signature_delta"):
    signature: str


class InputJsonDelta(Typed, tag="input_json_delta"):
    partial_json: str


class ContentBlockDelta(Typed, tag="content_block_delta"):
    index: int
    delta: TextDelta | ThinkingDelta | SignatureDelta | InputJsonDelta


class ContentBlockStop(Typed, tag="content_block_stop"):
    index: int


class MessageDeltaFields(Body):
    stop_reason: StopReason
    stop_sequence: str | None


class MessageDelta(Typed, tag="message_delta"):
    delta: MessageDeltaFields
    usage: AnthropicUsage


class MessageStop(Typed, tag="message_stop"):
    pass


MESSAGE_EVENTS = (
    MessageStart,
    ContentBlockStart,
    ContentBlockDelta,
    ContentBlockStop,
    MessageDelta,
    MessageStop,
    AnthropicError,
)
