"""The tool-calls constraint (grammars.ToolCalls): what its regex allows against `re`, with
jsonschema as the reference for the arguments, and the regex the server built before it was a
constraint kind (kept below as the reference); compiled to token masks, in this process and
in the compile workers, with errors that name the schema they come from."""

from __future__ import annotations

import dataclasses
import json
import re

import jsonschema
import pytest
from conftest import WEATHER
from hypothesis import given, settings
from hypothesis import strategies as st

from braid import grammars
from braid.grammars.compiling import compiler
from braid.grammars.compiling.constraint_regex import constraint_regex, escape, json_schema_regex
from braid.grammars.constraints import AnyText, Choices, JsonSchema, ToolCalls, ToolSchema
from braid.grammars.tool_calls import CLOSE, MARK, MID, OPEN, SEPARATOR, not_starting_with

ORDER = {
    "type": "object",
    "properties": {
        "items": {"type": "array", "items": {"enum": ["A1", "B2"]}, "minItems": 1, "maxItems": 2},
        "express": {"type": "boolean"},
    },
    "required": ["items"],
}
SEARCH = {
    "type": "object",
    "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["query"],
    "additionalProperties": False,
}
PING = {"type": "object", "properties": {}, "additionalProperties": False}  # no arguments
# Each tool's schema, and arguments valid and invalid under it (checked against jsonschema
# below), written as the regex writes JSON: compact, properties in the schema's order.
TOOLS = {
    "get_weather": (
        WEATHER,
        ['{"city":"Paris","unit":"celsius"}', '{"city":"a \\"b\\"\\nc","unit":"fahrenheit"}'],
        [
            '{"city":"Paris"}',
            '{"city":3,"unit":"celsius"}',
            '{"city":"Paris","unit":"k"}',
            '{"city":"' + "x" * 11 + '","unit":"celsius"}',
        ],
    ),
    "place_order": (
        ORDER,
        ['{"items":["A1"]}', '{"items":["B2","A1"],"express":true}'],
        ['{"items":[]}', '{"items":["Z9"]}', '{"express":false}', '{"items":["A1","A1","B2"]}'],
    ),
    "search": (SEARCH, ['{"query":"a b"}', '{"query":"","limit":5}'], ['{"limit":5}', "{}"]),
    "ping": (PING, ["{}"], ['{"x":1}', "[]"]),
}
UNKNOWN = "delete_all"  # a name no tool has
REPLY_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
TEXTS = {  # what may stand instead of calls, by name
    "none": None,
    "any": AnyText(),
    "schema": JsonSchema.of(REPLY_SCHEMA),
    "choices": Choices(("yes", "no")),
}
# Outputs that are text, with a call after text among them.
TEXT_OUTPUTS = [
    "",
    "hello",
    "<",
    "<tool_cal",
    "<tool_calx",
    "\n<tool_call>",
    "<tool_call>",
    "<tool_call>\n{",
    '{"ok":true}',
    '{"ok":1}',
    "yes",
    "no",
    "maybe",
    "hi " + OPEN + 'ping", "arguments": {}}\n</tool_call>',
]


def test_the_examples_are_what_they_say():
    for schema, valid, invalid in TOOLS.values():
        for arguments in valid:
            jsonschema.validate(json.loads(arguments), schema)
        for arguments in invalid:
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(json.loads(arguments), schema)


def constraint(names: list[str], parallel: bool, text: str) -> ToolCalls:
    tools = tuple(
        ToolSchema.of(name, TOOLS[name][0], f"tools[{i}].function.parameters")
        for i, name in enumerate(names)
    )
    return ToolCalls(tools, parallel, TEXTS[text])


def call(name: str, arguments: str) -> str:
    return f"{OPEN}{name}{MID}{arguments}{CLOSE}"


def text_allowed(text: str, mode: str) -> bool:
    """Whether `text` may stand instead of calls, by the mode's own reference."""
    if mode == "none":
        return False
    if mode == "any":
        return not text.startswith(MARK)
    if mode == "choices":
        return text in TEXTS["choices"].options
    try:
        jsonschema.validate(json.loads(text), REPLY_SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


# ---- the reference: how the server built the regex before (runtime/server/chat/tools.py) ----


def old_call_regex(
    names: list[str], arguments: list[str], parallel: bool, text_allowed: bool, text: str | None
) -> str:
    options = "|".join(
        f"({escape(name)}{escape(MID)}({args}))"
        for name, args in zip(names, arguments, strict=True)
    )
    one = f"{escape(OPEN)}({options}){escape(CLOSE)}"
    calls = f"({one}({escape(SEPARATOR)})?)+" if parallel else one
    if not text_allowed:
        return calls
    return f"({text if text is not None else not_starting_with(MARK)})|({calls})"


def old_regex(names: list[str], parallel: bool, mode: str) -> str:
    """The regex as the server built it: each tool's arguments the engine's regex of a
    json_schema constraint of its schema (without whitespace around the object: the call's
    fixed text places it), the reply's constraint's likewise."""
    arguments = [
        json_schema_regex(dataclasses.replace(JsonSchema.of(TOOLS[name][0]), around=False))
        for name in names
    ]
    own = TEXTS[mode] if mode in ("schema", "choices") else None
    text = None if own is None else constraint_regex(own)
    return old_call_regex(names, arguments, parallel, mode != "none", text)


# ---- what the regex allows -------------------------------------------------------------------

tool_sets = st.tuples(
    st.lists(st.sampled_from(sorted(TOOLS)), min_size=1, max_size=len(TOOLS), unique=True),
    st.booleans(),
    st.sampled_from(sorted(TEXTS)),
)
# Calls: a name (maybe unknown), valid or invalid arguments (which of them), the separator
# before the next call; then what follows the last.
call_outputs = st.tuples(
    st.lists(
        st.tuples(
            st.sampled_from([*sorted(TOOLS), UNKNOWN]),
            st.booleans(),
            st.integers(0, 3),
            st.sampled_from(["", SEPARATOR, SEPARATOR * 2]),
        ),
        min_size=1,
        max_size=3,
    ),
    st.sampled_from(["", SEPARATOR, SEPARATOR * 2, " done", SEPARATOR + "hi"]),
)


@settings(max_examples=60, deadline=None)
@given(tool_sets, call_outputs)
def test_calls_are_allowed_exactly_as_before(tool_set, output):
    names, parallel, mode = tool_set
    calls, trailing = output
    regex = constraint_regex(constraint(names, parallel, mode))
    assert regex == old_regex(names, parallel, mode)
    pattern = re.compile(regex)
    text, whole = "", True  # every call names a callable tool, its arguments valid
    for i, (name, valid, which, separator) in enumerate(calls):
        schema, good, bad = TOOLS.get(name, TOOLS["ping"])
        arguments = (good if valid else bad)[which % len(good if valid else bad)]
        whole = whole and name in names and valid
        text += call(name, arguments) + (separator if i < len(calls) - 1 else trailing)
    separators = [c[3] for c in calls[:-1]]
    if parallel:  # calls one after another, each followed by at most one separator
        shape = all(s in ("", SEPARATOR) for s in separators) and trailing in ("", SEPARATOR)
    else:
        shape = len(calls) == 1 and trailing == ""
    assert bool(pattern.fullmatch(text)) == (whole and shape), text
    for text in TEXT_OUTPUTS:
        assert bool(pattern.fullmatch(text)) == text_allowed(text, mode), (mode, text)


@settings(max_examples=40, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "city": st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=14),
            "unit": st.sampled_from(["celsius", "fahrenheit", "kelvin"]),
        },
    )
)
def test_arguments_are_accepted_as_jsonschema_validates_them(arguments):
    pattern = re.compile(constraint_regex(constraint(["get_weather"], False, "none")))
    ordered = {k: arguments[k] for k in WEATHER["properties"] if k in arguments}
    text = call("get_weather", json.dumps(ordered, ensure_ascii=False, separators=(",", ":")))
    if pattern.fullmatch(text):
        jsonschema.validate(arguments, WEATHER)
    else:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(arguments, WEATHER)


def test_each_mode_accepts_and_refuses():
    weather, ping = call("get_weather", '{"city":"Paris","unit":"celsius"}'), call("ping", "{}")
    one = re.compile(constraint_regex(constraint(["get_weather", "ping"], False, "none")))
    assert one.fullmatch(weather) and one.fullmatch(ping)
    for text in (weather + SEPARATOR + ping, weather + ping, "hello", "", weather + " ok"):
        assert not one.fullmatch(text), text
    several = re.compile(constraint_regex(constraint(["get_weather", "ping"], True, "none")))
    for text in (weather, weather + SEPARATOR + ping + SEPARATOR, weather + ping + weather):
        assert several.fullmatch(text), text
    for text in (weather + SEPARATOR + "done", call("get_weather", '{"city":"Paris"}'), "hi"):
        assert not several.fullmatch(text), text
    assert not several.fullmatch(call(UNKNOWN, "{}"))
    auto = re.compile(constraint_regex(constraint(["ping"], True, "any")))
    for text in ("Paris is sunny.", "", "<tool", "ok\n" + ping, ping):
        assert auto.fullmatch(text), text
    for text in (MARK, MARK + " maybe", ping + " and text", call("ping", '{"x":1}')):
        assert not auto.fullmatch(text), text
    reply = re.compile(constraint_regex(constraint(["ping"], False, "schema")))
    for text in ('{"ok":false}', ping):
        assert reply.fullmatch(text), text
    for text in ('{"ok":"yes"}', "hello", ""):
        assert not reply.fullmatch(text), text


def test_text_regex_refuses_only_the_marker():
    regex = re.compile(not_starting_with(MARK))
    for text in ("", "<", "<tool_cal", "hi\n<tool_call>", "<tool_calx", "\n<tool_call>"):
        assert regex.fullmatch(text), text
    for text in ("<tool_call>", "<tool_call>\n{"):
        assert not regex.fullmatch(text), text


@settings(max_examples=100, deadline=None)
@given(st.text(st.sampled_from("<tool_cal>\n x")), st.sampled_from(["<tool_call>", "ab"]))
def test_text_regex_is_every_text_not_starting_with_the_prefix(text, prefix):
    assert bool(re.fullmatch(not_starting_with(prefix), text)) == (not text.startswith(prefix))


# ---- compiled ---------------------------------------------------------------------------------


def test_the_constraint_compiles_to_masks(vocab, feeds):
    weather = call("get_weather", '{"city":"Paris","unit":"celsius"}')
    ping = call("ping", "{}")
    calls = compiler.compile(constraint(["get_weather", "ping"], True, "none"), vocab)
    assert feeds(calls, weather) and feeds(calls, weather + SEPARATOR + ping)
    assert not feeds(calls, "Sunny.") and not feeds(
        calls, call("get_weather", '{"city":1,"unit":"celsius"}')
    )
    auto = compiler.compile(constraint(["get_weather"], False, "any"), vocab)
    assert feeds(auto, "Sunny in Paris.") and feeds(auto, weather)
    assert not feeds(auto, MARK + "Sunny") and not feeds(auto, weather + SEPARATOR + weather)
    reply = compiler.compile(constraint(["ping"], False, "choices"), vocab)
    assert feeds(reply, "yes") and feeds(reply, ping) and not feeds(reply, "maybe")


def test_the_workers_compile_it_and_name_a_bad_schema(vocab, feeds):
    bad = {"type": "object", "properties": {"a": {"type": "nope"}}}
    tools = (
        ToolSchema.of("ping", PING, "tools[0].function.parameters"),
        ToolSchema.of("x", bad, "tools[1].function.parameters"),
    )
    workers = grammars.GrammarCompiler(vocab, workers=1)
    try:
        good = workers.submit(ToolCalls(tools[:1], False, AnyText())).result()
        assert feeds(good, call("ping", "{}")) and feeds(good, "pong")
        with pytest.raises(ValueError, match=r"^tools\[1\]\.function\.parameters: .*'nope'"):
            workers.submit(ToolCalls(tools)).result()
        text = JsonSchema.of({"type": "nope"})
        with pytest.raises(ValueError, match="^the reply's constraint: .*'nope'"):
            workers.submit(ToolCalls(tools[:1], text=text)).result()
    finally:
        workers.close()


def test_bad_values_are_refused_where_they_are_made():
    with pytest.raises(ValueError, match=r"^tools\[2\]\.function\.parameters: json_schema must"):
        ToolSchema.of("f", "[1]", "tools[2].function.parameters")
    deep = {"type": "object", "properties": {"a": json.loads("[" * 200 + "]" * 200)}}
    with pytest.raises(ValueError, match=r"^tools\[0\]\.function\.parameters: .*nested"):
        ToolSchema.of("f", deep, "tools[0].function.parameters")
    with pytest.raises(ValueError, match="at least one tool"):
        ToolCalls(())
    calls = constraint(["ping"], True, "any")
    assert calls == constraint(["ping"], True, "any") and hash(calls) == hash(
        constraint(["ping"], True, "any")
    )
