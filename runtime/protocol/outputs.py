"""What the engine hands back: a finished output, or one streamed chunk."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerateOutput:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS, stop string or stop token) | "length" | "abort"
    # prompt_tokens, cached_tokens, completion_tokens, preemptions; logprobs and
    # top_logprobs (per output token), prompt_logprobs and prompt_top_logprobs (per prompt
    # token from prompt_logprobs_from on) when asked for; "trace" when params.trace asks
    # (runtime/output/request_trace.py).
    meta: dict = field(default_factory=dict)


@dataclass
class StreamChunk:
    text: str  # the new text since the previous chunk
    token_ids: list[int]  # the new tokens since the previous chunk
    finish_reason: str | None = None  # set on the last chunk
    error: str | None = None  # why the engine gave up on the request (finish_reason "abort")
    # The request's own parameters caused `error` (its constraint and min_tokens left no
    # token, say): the client's mistake, not the engine's (a 400, not a 500, over HTTP).
    request_error: bool = False
    meta: dict | None = None  # on the last chunk: token counts, logprobs (see GenerateOutput)
    # When the request asked for logprobs: those of this chunk's tokens, and their top
    # alternatives (id -> logprob), one entry per token.
    logprobs: list[float] | None = None
    top_logprobs: list[dict[int, float]] | None = None
