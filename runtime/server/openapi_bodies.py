"""The bodies the routes answer with, as Structs that /openapi.json declares (openapi_responses.py
says which operation answers which; openapi_agent_bodies.py has the Responses and Messages
APIs'): what a client generator reads, and what the HTTP fuzz checks every answer against.
The routes build their replies as dicts, so these are written from the routes' code: a field
without a default is a key the route always writes, an UNSET one a key it writes only
sometimes. Unlisted keys are allowed (no forbid_unknown_fields): a
reply may gain fields without breaking the document, but not lose or retype one."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from braid.runtime.text.chat_template import ChatTemplate
from braid.runtime.text.reasoning import ReasoningFormat


class Body(msgspec.Struct):
    """Every answer's base: unknown fields allowed (see above)."""


class Typed(Body, tag_field="type"):
    """A body whose `type` names it (the tag): output items, content blocks, stream events."""


# ---- errors ----------------------------------------------------------------------------------


class ErrorDetail(Body):
    message: str
    type: str
    param: str | None
    code: str | int  # OpenAI's code where it has one, else the status


class Error(Body):
    """wire.error_body: every route's errors but the Anthropic ones'."""

    error: ErrorDetail


class AnthropicErrorDetail(Body):
    type: str
    message: str
    details: dict[str, Any] | UnsetType = UNSET  # a thread rejection's error_code


class AnthropicError(Typed, tag="error"):
    """wire.anthropic_error_body: /v1/messages' errors, and its streams' error event."""

    error: AnthropicErrorDetail


# ---- OpenAI: models, completions, chat, embeddings -------------------------------------------


class ModelCard(Body):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int
    parent: str | UnsetType = UNSET  # a LoRA adapter's base model


class ModelList(Body):
    object: Literal["list"]
    data: list[ModelCard]


class PromptTokensDetails(Body):
    cached_tokens: int


class CompletionTokensDetails(Body):
    reasoning_tokens: int


class Usage(Body):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails


# The engine's reasons ("abort": the client left, or the request failed midway).
FinishReason = Literal["stop", "length", "abort"]
ChatFinishReason = Literal["stop", "length", "abort", "tool_calls", "function_call"]


class CompletionLogprobs(Body):
    tokens: list[str]
    token_logprobs: list[float | None]  # an echoed prompt's first token has none
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(Body):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason


class Completion(Body):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class CompletionChunkChoice(Body):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class CompletionChunk(Body):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChunkChoice]  # none in the usage chunk
    usage: Usage | UnsetType = UNSET  # the last chunk's, with stream_options.include_usage


class CalledFunction(Body):
    name: str
    arguments: str  # JSON text


class ChatToolCallOut(Body):
    id: str
    type: Literal["function"]
    function: CalledFunction


class ChatReplyMessage(Body):
    role: Literal["assistant"]
    content: str | None
    # Where the reply shows the thought, under both names clients read.
    reasoning_content: str | None | UnsetType = UNSET
    reasoning: str | None | UnsetType = UNSET
    tool_calls: list[ChatToolCallOut] | UnsetType = UNSET
    function_call: CalledFunction | UnsetType = UNSET  # the legacy functions API's one call


class TopLogprob(Body):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Body):
    content: list[TokenLogprob]


class ChatChoice(Body):
    index: int
    message: ChatReplyMessage
    logprobs: ChatLogprobs | None
    finish_reason: ChatFinishReason


class ChatCompletion(Body):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class FunctionPiece(Body):
    arguments: str
    name: str | UnsetType = UNSET  # on a call's first piece


class ToolCallPiece(Body):
    index: int
    function: FunctionPiece
    id: str | UnsetType = UNSET  # id and type on a call's first piece
    type: Literal["function"] | UnsetType = UNSET


class ChatDelta(Body):
    role: Literal["assistant"] | UnsetType = UNSET  # on a choice's first chunk
    content: str | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET
    reasoning: str | UnsetType = UNSET
    tool_calls: list[ToolCallPiece] | UnsetType = UNSET
    function_call: FunctionPiece | UnsetType = UNSET


class ChatChunkChoice(Body):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: ChatFinishReason | None


class ChatCompletionChunk(Body):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]  # none in the usage chunk
    usage: Usage | UnsetType = UNSET


class Embedding(Body):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str  # str: encoding_format base64 (little-endian float32s)


class EmbeddingUsage(Body):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(Body):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


# ---- tokens, SGLang's native routes and braid's own ------------------------------------------


class Tokenized(Body):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None  # with return_token_strs


class TokenizedContent(Body, forbid_unknown_fields=True):
    """llama.cpp's answer, to a request in its form (`content`): its tokens alone, so that
    the other answer (Tokenized) with a field retyped is not taken for this one."""

    tokens: list[int]


class Detokenized(Body):
    prompt: str  # vLLM's name
    content: str  # llama.cpp's


# SGLang's listing entry: [logprob, token id, its text (with return_text_in_logprobs)].
LogprobEntry = tuple[float | None, int, str | None]


class LengthFinish(Typed, tag="length"):
    length: int


class StopFinish(Typed, tag="stop"):
    matched: None


class AbortFinish(Typed, tag="abort"):
    matched: None


class MetaInfo(Body):
    id: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: LengthFinish | StopFinish | AbortFinish | None  # None until the last event
    # Once finished:
    cached_tokens: int | UnsetType = UNSET
    preemptions: int | UnsetType = UNSET
    e2e_latency: float | UnsetType = UNSET
    reasoning_tokens: int | UnsetType = UNSET
    # With return_logprob (the input's once finished):
    output_token_logprobs: list[LogprobEntry] | UnsetType = UNSET
    output_top_logprobs: list[list[LogprobEntry]] | UnsetType = UNSET
    output_token_logprobs_length: int | UnsetType = UNSET
    input_token_logprobs: list[LogprobEntry] | UnsetType = UNSET
    input_top_logprobs: list[list[LogprobEntry] | None] | UnsetType = UNSET


class GenerateResult(Body):
    text: str
    output_ids: list[int]
    meta_info: MetaInfo
    index: int


class ModelInfo(Body):
    model_path: str
    tokenizer_path: str
    served_model_name: str
    is_generation: bool
    context_length: int
    chat_template: ChatTemplate | None
    generation_openings: dict[str, str] | None
    reasoning_format: ReasoningFormat | None


class EngineStatsBody(Body):
    """engine.stats(): the counters a dashboard or a scraper reads (there are more)."""

    requests_finished: int
    prompt_tokens: int
    cached_tokens: int
    running_requests: int
    waiting_requests: int
    kv_slots_total: int
    kv_slots_free: int
    kv_slots_cached: int
    grammar_memory_bytes: int


class ServerInfoFields(Body):
    """/server_info's own fields, beside the engine config's (EngineConfig's fields)."""

    served_model_name: str
    context_length: int
    queue_capacity: int
    active_sequences: int
    stats: EngineStatsBody


class Scores(Body):
    logprobs: list[list[float]]  # per continuation, its tokens' logprobs


class Released(Body):
    released: str  # the program_id


class Prepared(Body):
    prepared: Literal[True]


class LoraAdapters(Body):
    success: Literal[True]
    loaded_adapters: list[str]


class DashboardSample(Body):
    t: float
    running: int
    queued: int
    decode_tokens_per_s: float | None  # None on the first sample
    prefill_tokens_per_s: float | None
    kv_use: float
    kv_cached: float
    cache_hit: float
    grammar_memory_bytes: int
    requests_finished: int
    ttft_p50_ms: float | None  # None while no request ended in the window
    ttft_p90_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p90_ms: float | None
    tpot_p99_ms: float | None


class RequestSummary(Body):
    rid: int  # the engine's request id
    finish_reason: str
    arrival: float
    first_token: float | None
    finished: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ago_s: float
    ttft_ms: float | None
    tpot_ms: float | None
    # A request that asked for a trace:
    queued_ms: float | None | UnsetType = UNSET
    tokens: list[dict[str, Any]] | UnsetType = UNSET


class DashboardData(Body):
    now: float
    samples: list[DashboardSample]
    requests: list[RequestSummary]


class OpenApiDocument(Body):
    openapi: str
    info: dict[str, Any]
    paths: dict[str, Any]
    components: dict[str, Any]
