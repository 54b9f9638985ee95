"""What a request may be constrained to: small frozen values, hashable so compiled grammars
can be cached by them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from braid.grammars.structural_tag import StructuralTag


@dataclass(frozen=True)
class Regex:
    """Output must fully match this Python-style regular expression."""

    pattern: str


# The whitespace a JSON document may hold between two tokens, before it and after it, by
# default: what models write (they learnt JSON from pretty-printers as much as from compact
# text), bounded so that a model held off its own token cannot pad forever. A gap of a
# pretty-printed document is a newline and the indentation of its depth: 20 characters hold
# json.dumps(indent=2) to 9 levels deep, indent=4 to 4 and tabs to 19.
JSON_WHITESPACE = r"[ \n\t]{0,20}"
COMPACT = ""  # JsonSchema(whitespace=COMPACT): no whitespace at all


@dataclass(frozen=True)
class JsonSchema:
    """Output must be a JSON document valid under this schema.

    `schema` is the schema as compact JSON text so equal schemas share one compiled grammar;
    keys keep their order, since properties are generated in the schema's order; build it
    with `JsonSchema.of(dict_or_text)`. `whitespace` is the regex allowed between JSON
    tokens and around the document: by default JSON_WHITESPACE (what models write, bounded
    per gap), COMPACT ("") for none. `strict` (the default) writes an object's unlisted
    properties only where the schema gives `additionalProperties` explicitly, as XGrammar's
    strict mode does; `strict=False` follows the spec, where its absence allows any (written
    after the listed ones). `separators` (item, key), e.g. (", ", ": "), are the exact texts
    written between items and between a key and its value, as Python's json.dumps takes
    them (`whitespace` then only inside brackets and around the document).
    """

    schema: str
    whitespace: str = JSON_WHITESPACE
    strict: bool = True
    separators: tuple[str, str] | None = None
    # Whitespace around the document too; False for a document inside fixed text (a tool
    # call's arguments), where what surrounds it is the wrapper's.
    around: bool = True

    @classmethod
    def of(
        cls,
        schema: dict[str, Any] | str,
        whitespace: str = JSON_WHITESPACE,
        strict: bool = True,
        separators: tuple[str, str] | None = None,
    ) -> JsonSchema:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"json_schema is not valid JSON: {e}") from None
            except RecursionError:
                raise ValueError(
                    f"json_schema is nested more than {MAX_SCHEMA_DEPTH} levels deep"
                ) from None
        if not isinstance(schema, (dict, bool)):
            raise ValueError(f"json_schema must be an object, got {type(schema).__name__}")
        depth = json_depth(schema)
        if depth > MAX_SCHEMA_DEPTH:
            raise ValueError(
                f"json_schema is nested {depth} levels deep; at most {MAX_SCHEMA_DEPTH} "
                "are supported"
            )
        return cls(json.dumps(schema, separators=(",", ":")), whitespace, strict, separators)


# Deeper schemas are hostile rather than real (the deepest of MaskBench's 11,305 nests 63
# levels of objects and arrays, keyword objects such as "properties" counted), and converting
# one recurses per level.
MAX_SCHEMA_DEPTH = 128


def json_depth(value: Any) -> int:
    """How deeply objects and arrays nest in a JSON value (iteratively: the value may be
    nested deeper than Python's recursion limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = value.values()
        elif not isinstance(value, list):
            continue
        deepest = max(deepest, depth)
        stack.extend((v, depth + 1) for v in value)
    return deepest


@dataclass(frozen=True)
class Choices:
    """Output must be exactly one of these strings."""

    options: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.options:
            raise ValueError("choices must not be empty")


@dataclass(frozen=True)
class Ebnf:
    """Output must be a sentence of this lark grammar (start rule `start`)."""

    grammar: str


@dataclass(frozen=True)
class ToolSchema:
    """A tool a call may name, and the JSON schema of its arguments as compact JSON text (as
    JsonSchema keeps it: build it with `ToolSchema.of`). `where` is what errors call the
    schema (the request's field that gave it)."""

    name: str
    parameters: str
    where: str

    @classmethod
    def of(cls, name: str, parameters: dict[str, Any] | str, where: str) -> ToolSchema:
        try:
            schema = JsonSchema.of(parameters).schema
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        return cls(name, schema, where)


@dataclass(frozen=True)
class AnyText:
    """Any text that does not start with the call marker (grammars/tool_calls.py's MARK)."""


@dataclass(frozen=True)
class ToolCalls:
    """Output must be calls of these tools in the format of grammars/tool_calls.py, each
    naming one of them with arguments valid under its schema: one call, or several with
    `parallel`. `text` is what may stand instead of calls (tool_choice "auto"): None (calls
    only), AnyText(), or text under a JsonSchema or Choices constraint (response_format).
    The arguments hold the whitespace models write (JSON_WHITESPACE), none with `compact`."""

    tools: tuple[ToolSchema, ...]
    parallel: bool = False
    text: AnyText | JsonSchema | Choices | None = None
    compact: bool = False  # the arguments without whitespace (as JsonSchema's COMPACT)

    def __post_init__(self) -> None:
        if not self.tools:
            raise ValueError("tool calls need at least one tool")


Constraint = Regex | JsonSchema | Choices | Ebnf | ToolCalls | StructuralTag

# `gen(dtype=...)`: what each Python type looks like as text.
DTYPE_REGEXES: dict[type, str] = {
    int: r"[+-]?(0|[1-9][0-9]*)",
    float: r"[+-]?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?",
    bool: r"(True|False)",
    str: r'"([^"\\\x00-\x1f]|\\["\\/bfnrt])*"',
}


def dtype_constraint(dtype: type) -> Regex:
    try:
        return Regex(DTYPE_REGEXES[dtype])
    except KeyError:
        names = ", ".join(t.__name__ for t in DTYPE_REGEXES)
        raise ValueError(f"dtype must be one of {names}, got {dtype!r}") from None
