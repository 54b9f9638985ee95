"""The regex of a regex, JSON-schema, choices, tool-calls or structural-tag constraint (what the
lazy automaton or an outlines index compiles), and `escape`, a regex matching a text exactly.
Kept free of torch: the compile worker process (see jobs.py) runs it."""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict

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
    return json_schema_regex(constraint)


def json_schema_regex(constraint: JsonSchema) -> str:
    """The schema's regex, converted once per process while it stays in _SCHEMA_REGEXES: the
    schemas that recur across constraints (a tool's parameters in each tool set that lists
    it, a structural tag's or a grammar's JSON parts) are converted once."""
    regex = _SCHEMA_REGEXES.get(constraint)
    if regex is None:
        from braid.grammars.json_schema.convert import schema_to_regex

        regex = schema_to_regex(
            json.loads(constraint.schema),
            constraint.whitespace,
            constraint.strict,
            constraint.separators,
            constraint.around,
        )
        _SCHEMA_REGEXES.put(constraint, regex)
    return regex


class _RegexCache:
    """The last-used regexes, within `max_chars` in all."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._regexes: OrderedDict[JsonSchema, str] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()  # compile() converts on its callers' threads

    def get(self, key: JsonSchema) -> str | None:
        with self._lock:
            regex = self._regexes.get(key)
            if regex is not None:
                self._regexes.move_to_end(key)
            return regex

    def put(self, key: JsonSchema, regex: str) -> None:
        with self._lock:
            if key in self._regexes or len(regex) > self.max_chars:
                return
            self._regexes[key] = regex
            self._chars += len(regex)
            while self._chars > self.max_chars:
                _, old = self._regexes.popitem(last=False)
                self._chars -= len(old)


# A compile worker's memory limit is gigabytes; its regexes are held within 64 MB.
_SCHEMA_REGEXES = _RegexCache(64 << 20)


def short(pattern: str) -> str:
    """`pattern` quoted for an error message, cut at 200 characters."""
    return repr(pattern if len(pattern) <= 200 else pattern[:200] + "...")
