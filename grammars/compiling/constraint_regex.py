"""The regex of a regex, JSON-schema, choices, tool-calls or structural-tag constraint (what the
lazy automaton or an outlines index compiles), and `escape`, a regex matching a text exactly.
Kept free of torch: the compile worker process (see jobs.py) runs it."""

from __future__ import annotations

import json
import re

from braid.grammars.constraints import Choices, JsonSchema, Regex, StructuralTag, ToolCalls

# Characters with a meaning in Python's or Rust's regex syntax (outlines-core parses with
# Rust's, whose parser rejects some of Python's re.escape output, e.g. an escaped space).
_META = set("\\.+*?()|[]{}^$#&-~")
_CONTROL = {"\t": r"\t", "\n": r"\n", "\r": r"\r", "\f": r"\f", "\v": r"\v"}


def escape(text: str) -> str:
    """A regex matching exactly `text`, in the syntax both Python and outlines-core read."""
    return "".join("\\" + c if c in _META else _CONTROL.get(c, c) for c in text)


def constraint_regex(constraint: Regex | JsonSchema | Choices | ToolCalls | StructuralTag) -> str:
    if isinstance(constraint, Regex):
        try:
            re.compile(constraint.pattern)
        except re.error as e:
            raise ValueError(f"invalid regex {short(constraint.pattern)}: {e}") from None
        return constraint.pattern
    if isinstance(constraint, Choices):
        return "|".join(f"({escape(o)})" for o in constraint.options)
    if isinstance(constraint, ToolCalls):
        # Imported here: the tool-call regex is built of these constraints' regexes.
        from braid.grammars.tool_calls import tool_calls_regex

        return tool_calls_regex(constraint)
    if isinstance(constraint, StructuralTag):
        # Imported here: the structural tag's regex is built of these constraints' regexes.
        from braid.grammars.structural_tag_regex import structural_tag_regex

        return structural_tag_regex(constraint)
    from braid.grammars.json_schema.convert import schema_to_regex

    return schema_to_regex(
        json.loads(constraint.schema),
        constraint.whitespace,
        constraint.strict,
        constraint.separators,
    )


def short(pattern: str) -> str:
    """`pattern` quoted for an error message, cut at 200 characters."""
    return repr(pattern if len(pattern) <= 200 else pattern[:200] + "...")
