"""Request limits (RequestLimits: `braid serve` flags) checked where a request arrives.

The sampling fields are checked raw, before they are decoded: decoding parses each stop
regex on the event loop, so a megabyte of them must be refused unread. Prompts are checked
once tokenized (and by their length before, where no tokenization could fit). Each refusal
is a 400 naming the field, the bound and the flag that sets it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from braid.grammars.constraints import json_depth
from braid.runtime.config import RequestLimits
from braid.runtime.server.wire import BadRequest

# Fields whose text is compiled into a constraint (SGLang's `ebnf` is braid's `grammar`).
_CONSTRAINT_TEXT = ("regex", "grammar", "ebnf")


def check_fields(fields: dict[str, Any], limits: RequestLimits, where: str = "") -> None:
    """A request's sampling fields as they came (OpenAI's top level, or one of /generate's
    sampling_params, `where` prefixing the names): counts, lengths and sizes. A field of the
    wrong type is left to decoding, which names it."""
    for name in ("n", "best_of"):
        value = fields.get(name)
        if isinstance(value, int) and value > limits.max_n:
            _refuse(f"{where}{name} is {value}", limits.max_n, "max_n")
    for name in ("stop", "stop_regex", "stop_token_ids"):
        value = fields.get(name)
        entries = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        _at_most(
            f"{where}{name}", "entries", len(entries), limits.max_stop_strings, "max_stop_strings"
        )
        if name != "stop_token_ids":
            longest = max((len(e) for e in entries if isinstance(e, str)), default=0)
            what = "characters in one entry"
            _at_most(f"{where}{name}", what, longest, limits.max_stop_length, "max_stop_length")
    bias = fields.get("logit_bias")
    if isinstance(bias, dict):
        _at_most(
            f"{where}logit_bias", "entries", len(bias), limits.max_logit_bias, "max_logit_bias"
        )
    choices = fields.get("choices")
    if isinstance(choices, list):
        _at_most(f"{where}choices", "options", len(choices), limits.max_choices, "max_choices")
        size = sum(len(c.encode()) for c in choices if isinstance(c, str))
        _constraint_size(f"{where}choices", size, limits)
    for name in _CONSTRAINT_TEXT:
        if isinstance(fields.get(name), str):
            _constraint_size(f"{where}{name}", len(fields[name].encode()), limits)
    if fields.get("json_schema") is not None:
        check_schema(fields["json_schema"], limits, f"{where}json_schema")


def check_openai_body(obj: dict[str, Any], limits: RequestLimits) -> None:
    """An OpenAI request body as it came: its sampling fields, its response_format's schema
    and each tool's parameters."""
    check_fields(obj, limits)
    schema = _at(obj, "response_format", "json_schema", "schema")
    if schema is not None:
        check_schema(schema, limits, "response_format.json_schema.schema")
    tools = obj.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        parameters = _at(tool, "function", "parameters")
        if parameters is not None:
            check_schema(parameters, limits, f"tools[{i}].function.parameters")


def check_schema(schema: Any, limits: RequestLimits, field: str) -> None:
    """A JSON schema (an object, or its JSON text) within the size and depth limits: its size
    measured as compact JSON first, so a huge one is refused before it is walked."""
    if isinstance(schema, str):
        text = schema.encode()
    else:
        try:
            text = msgspec.json.encode(schema)
        except (TypeError, ValueError, RecursionError):
            return  # not JSON: decoding names it
    _constraint_size(field, len(text), limits)
    try:
        value = msgspec.json.decode(text) if isinstance(schema, str) else schema
    except msgspec.DecodeError:
        return  # not JSON text: compiling it names the problem
    except RecursionError:
        _refuse(
            f"{field} is nested too deeply to read", limits.max_schema_depth, "max_schema_depth"
        )
    depth = json_depth(value)
    if depth > limits.max_schema_depth:
        _refuse(
            f"{field} is nested {depth} levels deep", limits.max_schema_depth, "max_schema_depth"
        )


def check_max_tokens(field: str, max_tokens: int, num_prompt_tokens: int, context: int) -> None:
    """OpenAI's rule: the prompt and the tokens asked for must fit the model's context."""
    room = context - num_prompt_tokens
    if max_tokens > room:
        raise BadRequest(
            f"{field} is {max_tokens}, but the prompt has {num_prompt_tokens} tokens and the "
            f"model's context is {context} tokens: at most {room}"
        )


def check_continuations(prefix: str, continuations: list[str], limits: RequestLimits) -> None:
    """A select's choices (/braid/score): how many, and the text scoring them tokenizes (the
    prefix with each continuation), before any of it is tokenized."""
    count = len(continuations)
    _at_most("continuations", "entries", count, limits.max_choices, "max_choices")
    chars = len(prefix) * count + sum(len(c) for c in continuations)
    what = "characters to tokenize (the prefix with each continuation)"
    _at_most("prefix + continuations", what, chars, limits.max_score_chars, "max_score_chars")


def _at(obj: Any, *path: str) -> Any:
    """obj[path[0]][path[1]]..., None where a step is missing or not an object."""
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _at_most(field: str, what: str, count: int, bound: int, flag: str) -> None:
    if count > bound:
        _refuse(f"{field} has {count} {what}", bound, flag)


def _constraint_size(field: str, size: int, limits: RequestLimits) -> None:
    bound = limits.max_constraint_bytes
    if size > bound:
        _refuse(f"{field} is {size} bytes", bound, "max_constraint_bytes")


def _refuse(what: str, bound: int, flag: str) -> None:
    raise BadRequest(f"{what}; this server allows at most {bound} (--{flag.replace('_', '-')})")
