"""One sample's output read as it streams, for every conversational route alike: its thought
(where the model thinks: split off by the reasoning format's splitter first), its text, or
(where the tool plan lets the output be calls) whole calls, and why it ended. Only the text
after the thought is read for calls: tools.CallParser's Hermes calls, or under harmony (GPT-OSS)
the splitter's own: a commentary message to a function,
`to=functions.NAME<|channel|>commentary json<|message|>ARGS<|call|>`, which the engine's
harmony call grammar holds to the tools. Each route turns the events into its own wire
format."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from braid.runtime.server.chat import tools
from braid.runtime.server.chat.reasoning_fields import Thinking
from braid.runtime.server.chat.tools import ToolPlan
from braid.runtime.text.reasoning import Opening, ReasoningFormat
from braid.runtime.text.thought_split import splitter


@dataclass(frozen=True)
class Split:
    """How a reasoning request's output is read: its format, where its prompt left the
    model, and what the request asked of the thought (Thinking's separate, whole, include)."""

    fmt: ReasoningFormat
    opening: Opening
    thinking: Thinking

    @property
    def closed(self) -> bool:
        """The prompt closed the thought (an empty one: Qwen3's enable_thinking false,
        SmolLM3's /no_think): the output is all answer, read as it was written. (A harmony
        prompt that opens the final channel still has its answer's end marked.)"""
        return self.opening == "off" and self.fmt.kind == "think"

    @property
    def shown(self) -> bool:
        """The reply carries the thought apart from its text."""
        return self.thinking.separate and self.thinking.include


class Reply:
    """`read` takes each chunk's text (and, on the last chunk, the engine's finish reason) and
    gives what it completes: ("reasoning", str) for the thought, ("text", str) for text; for
    each whole call ("call", i) then ("arguments", i, its arguments), the call being
    `calls[i]`. A call cut off by max_tokens is never reported."""

    def __init__(self, plan: ToolPlan | None, split: Split | None = None) -> None:
        self.plan = plan
        self.split = split
        calling = plan is not None and plan.calls
        self._harmony = split is not None and split.fmt.kind == "harmony"
        self.parser = tools.CallParser() if calling and not self._harmony else None
        self._reader = None
        if split is not None and split.thinking.separate and not split.closed:
            # Qwen3's templates let a call marker inside a thought end it.
            closers = (tools.MARK,) if calling and split.fmt.kind == "think" else ()
            self._reader = splitter(split.fmt, split.opening, closers)
        self._harmony_calls: list[tools.Call] = []
        self._texts: list[str] = []
        self._thoughts: list[str] = []
        self._held: list[str] = []  # thought held back to go out whole (stream_reasoning false)
        # Set on the last chunk: the engine's, or "tool_calls" where the output ended after
        # whole calls (tools.finish_reason).
        self.finish_reason: str | None = None

    @property
    def parsed(self) -> bool:
        """Whether the output is read for calls (the plan lets it be calls)."""
        harmony_calls = self._harmony and self.plan is not None and self.plan.calls
        return self.parser is not None or harmony_calls

    @property
    def calls(self) -> list[tools.Call]:
        return self.parser.calls if self.parser is not None else self._harmony_calls

    @property
    def is_text(self) -> bool:
        """The output is text, not calls (so far)."""
        if self.parser is not None:
            return self.parser.is_text
        return not self._harmony_calls

    @property
    def repeated(self) -> bool:
        """The output repeated a call, which ends it (tools.CallParser)."""
        return self.parser is not None and self.parser.repeated

    @property
    def text(self) -> str:
        """The text read so far (after the thought, when it is split off)."""
        return "".join(self._texts)

    @property
    def shows_reasoning(self) -> bool:
        """The reply carries the thought apart (a reasoning request that keeps it)."""
        return self.split is not None and self.split.shown

    @property
    def reasoning(self) -> str:
        """The thought read so far."""
        return "".join(self._thoughts)

    def read(self, text: str, finish_reason: str | None = None) -> list[tuple]:
        """The events `text` completes; with `finish_reason`, the output's last ones too (a
        held prefix of a marker is text after all)."""
        if self._reader is not None:
            pieces = self._reader.feed(text)
            if finish_reason is not None:
                pieces += self._reader.finish()
        else:
            pieces = [("text", text)] if text else []
        events: list[tuple] = []
        for piece in pieces:
            events += self._read(piece)
        if finish_reason is not None:
            if self.parser is not None:
                events += self.parser.finish()
                finish_reason = tools.finish_reason(self.parser, finish_reason)
            elif self._harmony_calls and finish_reason == "stop":
                finish_reason = "tool_calls"
            events = self._release() + events
            self.finish_reason = finish_reason
        self._texts += [e[1] for e in events if e[0] == "text"]
        return events

    def _read(self, piece: tuple) -> list[tuple]:
        kind = piece[0]
        if kind == "reasoning":
            if not self.shows_reasoning:
                return []
            self._thoughts.append(piece[1])
            if self.split.thinking.whole:
                self._held.append(piece[1])
                return []
            return [piece]
        events = self._release()
        if kind == "text":
            return events + (self.parser.feed(piece[1]) if self.parser is not None else [piece])
        # A harmony commentary message to a function (its splitter's "call").
        _, name, arguments = piece
        call = self._harmony_call(name, arguments)
        if call is None:  # not a call the request allows: what the model wrote is text
            return events + [("text", arguments)]
        self._harmony_calls.append(call)
        i = len(self._harmony_calls) - 1
        return events + [("call", i), ("arguments", i, arguments)]

    def _harmony_call(self, name: str, arguments: str) -> tools.Call | None:
        """The call a commentary message makes, if the plan lets the output be calls and it
        names a tool the plan lets it call with a JSON object (what the call grammar holds
        the output to; else None)."""
        plan = self.plan
        if plan is None or not plan.calls or name not in {t.function.name for t in plan.callable}:
            return None
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return None
        if not isinstance(parsed, dict):
            return None
        return tools.Call(f"call_{uuid.uuid4().hex[:24]}", name, arguments)

    def _release(self) -> list[tuple]:
        """A thought held back to go out whole, once it has ended."""
        if not self._held:
            return []
        held, self._held = "".join(self._held), []
        return [("reasoning", held)]
