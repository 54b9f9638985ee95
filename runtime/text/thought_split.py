"""An output split as it streams into its thought and its answer: a reader per reasoning
format, each giving events ("reasoning", text) and ("text", text), and harmony's also
("call", name, arguments) for a commentary message to a function.

The thought's surrounding whitespace and the answer's leading whitespace are dropped (the
templates write newlines around the tags); a partial marker is held until the text after it
says what it is. A thought that never closes is all reasoning.
"""

from __future__ import annotations

import re

from braid.runtime.text.reasoning import Opening, ReasoningFormat

Event = tuple


def splitter(fmt: ReasoningFormat, opening: Opening, closers: tuple[str, ...] = ()):
    """The reader of one output in `fmt` whose prompt left the model at `opening`;
    `closers`: texts that end a thought and begin the answer (Qwen3's `<tool_call>`)."""
    if fmt.kind == "harmony":
        return HarmonyReader(opening)
    return ThinkReader(fmt.start, fmt.end, opening, closers)


def _held_prefix(text: str, markers: tuple[str, ...]) -> int:
    """The length of the longest end of `text` that begins one of `markers`."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:n]):
                best = n
                break
    return best


class ThinkReader:
    def __init__(self, start: str, end: str, opening: Opening, closers: tuple[str, ...]) -> None:
        self.start, self.end, self.closers = start, end, closers
        self.state = {"maybe": "maybe", "thinking": "thought", "off": "answer"}[opening]
        self._held = ""
        self._thought_started = False  # its leading whitespace is dropped
        self._answer_started = False

    def feed(self, text: str) -> list[Event]:
        self._held += text
        out: list[Event] = []
        if self.state == "maybe":
            head = self._held.lstrip()
            if not head or (self.start.startswith(head) and head != self.start):
                return out  # whitespace, or the start of the opening tag: not known yet
            if head.startswith(self.start):
                self.state, self._held = "thought", head[len(self.start) :]
            else:
                self.state = "answer"
        if self.state == "thought":
            self._read_thought(out)
        if self.state == "answer":
            self._answer(self._held, out)
            self._held = ""
        return out

    def finish(self) -> list[Event]:
        held, self._held = self._held, ""
        if self.state == "thought":
            thought = held.rstrip() if self._thought_started else held.strip()
            return [("reasoning", thought)] if thought else []
        out: list[Event] = []
        self._answer(held, out)
        return out

    def _read_thought(self, out: list[Event]) -> None:
        held = self._held
        ends = [(i, m) for m in (self.end, *self.closers) if (i := held.find(m)) >= 0]
        if ends:
            i, marker = min(ends)
            self._thought(held[:i].rstrip(), out)
            rest = held[i + len(marker) :] if marker == self.end else held[i:]
            self.state, self._held = "answer", rest
            return
        keep = _held_prefix(held, (self.end, *self.closers))
        body, tail = held[: len(held) - keep], held[len(held) - keep :]
        stripped = body.rstrip()  # trailing whitespace waits: the thought may end after it
        self._thought(stripped, out)
        self._held = body[len(stripped) :] + tail

    def _thought(self, text: str, out: list[Event]) -> None:
        if not self._thought_started:
            text = text.lstrip()
        if text:
            self._thought_started = True
            out.append(("reasoning", text))

    def _answer(self, text: str, out: list[Event]) -> None:
        if not self._answer_started:
            text = text.lstrip()
        if text:
            self._answer_started = True
            out.append(("text", text))


_HEADER = re.compile(r"(?:<\|start\|>)?(?P<head>[^<]*)<\|channel\|>(?P<rest>.*)", re.S)
_ENDS = ("<|end|>", "<|call|>", "<|return|>")


class HarmonyReader:
    """Harmony messages: `<|channel|>CH[ to=R][ <|constrain|>T]<|message|>BODY<|end|>`, each
    after `<|start|>assistant` but the first. analysis is reasoning, final and commentary
    without a recipient are text, commentary to `functions.NAME` is a call of NAME."""

    def __init__(self, opening: Opening) -> None:
        self._held = ""
        self._channel = {"maybe": None, "thinking": "analysis", "off": "final"}[opening]
        self._recipient: str | None = None
        self._arguments: list[str] = []

    def feed(self, text: str) -> list[Event]:
        self._held += text
        out: list[Event] = []
        while True:
            if self._channel is None:
                if not self._read_header(out):
                    return out
            else:
                i = min((j for m in _ENDS if (j := self._held.find(m)) >= 0), default=-1)
                if i < 0:
                    keep = _held_prefix(self._held, _ENDS)
                    self._body(self._held[: len(self._held) - keep], out)
                    self._held = self._held[len(self._held) - keep :]
                    return out
                self._body(self._held[:i], out)
                marker = next(m for m in _ENDS if self._held.startswith(m, i))
                self._held = self._held[i + len(marker) :]
                self._close(out)

    def finish(self) -> list[Event]:
        out: list[Event] = []
        if self._channel is not None:
            self._body(self._held, out)
            self._close(out)
        elif self._held.strip():
            out.append(("text", self._held))  # a header that never ended: shown as it is
        self._held = ""
        return out

    def _read_header(self, out: list[Event]) -> bool:
        """Take a whole header from the held text: False while it is not complete."""
        i = self._held.find("<|message|>")
        if i < 0:
            head = self._held.lstrip()
            if head and not "<|".startswith(head[:2]):
                self._channel = "final"  # an answer written without a header
                return True
            return False
        header, self._held = self._held[:i], self._held[i + len("<|message|>") :]
        match = _HEADER.match(header.strip())
        fields = (match["head"] + " " + match["rest"]) if match else header
        words = fields.replace("<|constrain|>", " ").split()
        recipient = next((w[3:] for w in words if w.startswith("to=")), None)
        channel = re.split(r"[\s<]", match["rest"].strip())[0] if match else "final"
        self._channel, self._recipient = channel, recipient
        return True

    def _body(self, text: str, out: list[Event]) -> None:
        if not text:
            return
        if self._recipient is not None:
            self._arguments.append(text)
        elif self._channel == "analysis":
            out.append(("reasoning", text))
        else:
            out.append(("text", text))

    def _close(self, out: list[Event]) -> None:
        if self._recipient is not None:
            name = self._recipient.removeprefix("functions.")
            out.append(("call", name, "".join(self._arguments)))
        self._channel, self._recipient, self._arguments = None, None, []
