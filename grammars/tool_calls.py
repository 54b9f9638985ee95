"""Tool calls: the text a model writes them as, and the regex of what a ToolCalls constraint
allows. Kept free of torch: the compile worker process runs it.

Calls are written in the Hermes format, which Qwen2.5, Qwen3, Hermes and other models are
trained on and their chat templates render:

    <tool_call>
    {"name": "get_weather", "arguments": {"city":"Paris"}}
    </tool_call>

several calls one after another, a newline between them (optional in the constraint).

Each call is the fixed text above with the name one of the tools' names and the arguments the
regex braid's JSON-schema compiler makes of that tool's schema, so a call that is complete
validates against its schema. With text allowed instead (tool_choice "auto") the regex is
`TEXT | CALLS`, TEXT being any text that does not start with MARK (or the reply's own JSON
schema or choices): whether the model calls is decided by its first tokens, and once it has
written MARK it can only finish a call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from braid.grammars.compiling.constraint_regex import constraint_regex, escape, json_schema_regex
from braid.grammars.constraints import (
    COMPACT,
    JSON_WHITESPACE,
    AnyText,
    JsonSchema,
    ToolCalls,
    ToolSchema,
)

MARK = "<tool_call>"  # an output starting with this is calls
OPEN = MARK + '\n{"name": "'  # then the name
MID = '", "arguments": '  # then the arguments object
CLOSE = "}\n</tool_call>"
SEPARATOR = "\n"  # between calls
# What errors call the constraint on the text that may stand instead of calls.
REPLY = "the reply's constraint"


def tool_calls_regex(constraint: ToolCalls) -> str:
    """The regex of the outputs `constraint` allows; a ValueError names the tool's schema
    (ToolSchema.where) or the reply's constraint it comes from."""
    arguments = [
        _located(tool.where, json_schema_regex, arguments_schema(tool, constraint.compact))
        for tool in constraint.tools
    ]
    options = "|".join(
        f"({escape(tool.name)}{escape(MID)}({regex}))"
        for tool, regex in zip(constraint.tools, arguments, strict=True)
    )
    call = f"{escape(OPEN)}({options}){escape(CLOSE)}"
    calls = f"({call}({escape(SEPARATOR)})?)+" if constraint.parallel else call
    text = constraint.text
    if constraint.compact and isinstance(text, JsonSchema):
        text = dataclasses.replace(text, whitespace=COMPACT)
    if text is None:
        return calls
    if isinstance(text, AnyText):
        return f"({not_starting_with(MARK)})|({calls})"
    return f"({_located(REPLY, constraint_regex, text)})|({calls})"


def arguments_schema(tool: ToolSchema, compact: bool) -> JsonSchema:
    """The constraint of a tool's arguments: its schema, with the whitespace models write
    (none with `compact`) but none around the object, which the call's fixed text places."""
    return JsonSchema(tool.parameters, COMPACT if compact else JSON_WHITESPACE, around=False)


def _located(where: str, convert: Callable[[Any], str], part: Any) -> str:
    """convert(part), its errors prefixed with where the part comes from."""
    try:
        return convert(part)
    except RecursionError:
        raise ValueError(f"{where} is nested too deeply to compile") from None
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def not_starting_with(prefix: str) -> str:
    """A regex of every text (newlines included) that does not start with `prefix`: empty, a
    proper prefix of it, or its first i characters and then another character."""
    regex = ""
    for c in reversed(prefix):
        inner = f"|{escape(c)}{regex}" if regex else ""
        regex = rf"([^{escape(c)}][\s\S]*{inner})?"
    return regex
