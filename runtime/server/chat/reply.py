"""One sample's output read as it streams, for every conversational route alike: text, or
(where the tool plan lets the output be calls) whole calls read by tools.CallParser, and why
it ended. Each route turns the events into its own wire format."""

from __future__ import annotations

from braid.runtime.server.chat import tools
from braid.runtime.server.chat.tools import ToolPlan


class Reply:
    """`read` takes each chunk's text (and, on the last chunk, the engine's finish reason) and
    gives what it completes: ("text", str) for text; for each whole call ("call", i) then
    ("arguments", i, its arguments), the call being `calls[i]`. A call cut off by max_tokens
    is never reported."""

    def __init__(self, plan: ToolPlan | None) -> None:
        self.parser = tools.CallParser() if plan is not None and plan.calls else None
        # Set on the last chunk: the engine's, or "tool_calls" where the output ended after
        # whole calls (tools.finish_reason).
        self.finish_reason: str | None = None

    @property
    def parsed(self) -> bool:
        """Whether the output is read for calls (the plan lets it be calls)."""
        return self.parser is not None

    @property
    def calls(self) -> list[tools.Call]:
        return self.parser.calls if self.parser is not None else []

    @property
    def is_text(self) -> bool:
        """The output is text, not calls (so far)."""
        return self.parser is None or self.parser.is_text

    def read(self, text: str, finish_reason: str | None = None) -> list[tuple]:
        """The events `text` completes; with `finish_reason`, the output's last ones too (a
        held prefix of the call marker is text after all)."""
        if self.parser is None:
            events = [("text", text)] if text else []
        else:
            events = self.parser.feed(text)
        if finish_reason is not None:
            if self.parser is not None:
                events += self.parser.finish()
                finish_reason = tools.finish_reason(self.parser, finish_reason)
            self.finish_reason = finish_reason
        return events
