"""What every conversational route's request comes to once its wire format is read: the
conversation to render, and what to generate after it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from braid.runtime.protocol.sampling_params import SamplingParams
from braid.runtime.server.chat.reasoning_fields import Thinking
from braid.runtime.server.wire import ChatMessage, NamedToolChoice, Tool


@dataclass(frozen=True)
class Conversation:
    """The prompt's parts: the messages (calls in assistant messages' tool_calls, results in
    tool messages), the tools and what tool_choice lets the reply be, the chat template's own
    variables, what the request asks of the model's thought, and the start of the reply the
    model continues (a prefill)."""

    messages: list[ChatMessage]
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # None: one call or more, as OpenAI's default
    # chat_template_kwargs, checked by Service.template_variables before they are rendered.
    template_variables: dict[str, Any] | None = None
    thinking: Thinking = Thinking()
    prefill: str = ""  # Messages' final assistant message: the reply continues it
    named_as: str = "messages"  # how errors about the messages' length name them


@dataclass(frozen=True)
class ConversationRequest:
    """A conversation and its samples: `params` (n of them) as the request set them, before
    the tool constraint. The request's max tokens are bounded in one of two ways: a field the
    client gave (`max_tokens_field`, named in the 400) must fit the context with the prompt;
    or, with `fit_max_tokens`, max_tokens is cut to the room the prompt leaves. Neither: the
    engine stops at the context's end."""

    conversation: Conversation
    params: SamplingParams
    max_tokens_field: str | None = None
    fit_max_tokens: bool = False
