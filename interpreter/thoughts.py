"""A reasoning gen's output split into its thought and its answer, for every backend that
knows the model's reasoning format."""

from __future__ import annotations

from braid.runtime.text.reasoning import Opening, ReasoningFormat
from braid.runtime.text.thought_split import splitter


def split_thought(fmt: ReasoningFormat, opening: Opening, text: str) -> dict[str, str]:
    """The meta a reasoning gen's output carries: its `reasoning_content` and `content`.
    ValueError where the model called a function (harmony) instead of writing text."""
    reader = splitter(fmt, opening)
    parts: dict[str, list[str]] = {"reasoning": [], "text": []}
    for event in [*reader.feed(text), *reader.finish()]:
        if event[0] == "call":  # harmony's commentary to a function: not a gen's text
            raise ValueError(
                f"the model called function {event[1]!r} where a gen writes text; hold "
                "the answer to a constraint (regex, json_schema, ...) to keep it text"
            )
        parts[event[0]].append(event[1])
    return {"reasoning_content": "".join(parts["reasoning"]), "content": "".join(parts["text"])}
