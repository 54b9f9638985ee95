"""What the engine hands back: a finished output, or one streamed chunk."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerateOutput:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS, stop string or stop token) | "length" | "abort"
    meta: dict = field(default_factory=dict)  # prompt_tokens, completion_tokens, ...


@dataclass
class StreamChunk:
    text: str  # the new text since the previous chunk
    token_ids: list[int]  # the new tokens since the previous chunk
    finish_reason: str | None = None  # set on the last chunk
