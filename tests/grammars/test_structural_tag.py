"""Structural tags (grammars/structural_tag.py, grammars/structural_tag_regex.py): each format's
regex against Python's `re` with texts it must accept and refuse; triggered tags whose calls
carry JSON, judged by a reference reader with jsonschema, and outputs written by random walks
over the compiled masks judged the same way; every refusal names its path."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from braid import grammars
from braid.grammars.matcher import allowed_token_ids
from braid.grammars.structural_tag import StructuralTag
from braid.grammars.structural_tag_regex import structural_tag_regex

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer"}},
    "required": ["city"],
    "additionalProperties": False,
}
PING = {"type": "object", "properties": {}, "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER, "ping": PING}
TRIGGER, END = "<function=", "</function>"


def const(value: str) -> dict:
    return {"type": "const_string", "value": value}


def tag(begin: str, content: dict, end: str | list[str]) -> dict:
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def call_tag(name: str) -> dict:
    content = {"type": "json_schema", "json_schema": SCHEMAS[name]}
    return tag(f"{TRIGGER}{name}>", content, END)


def calls(**flags) -> dict:
    tags = [call_tag(name) for name in SCHEMAS]
    return {"type": "triggered_tags", "triggers": [TRIGGER], "tags": tags, **flags}


def regex_of(fmt: dict) -> re.Pattern:
    return re.compile(structural_tag_regex(StructuralTag.of({"format": fmt})))


THINK = tag("<think>", {"type": "any_text"}, "</think>")
# format -> (texts its language holds, texts it does not)
CASES = {
    "const_string": (const("Answer: "), ["Answer: "], ["Answer:", "answer: ", ""]),
    "json_schema": (
        {"type": "json_schema", "json_schema": WEATHER, "max_whitespace_cnt": 2},
        ['{"city":"Paris"}', '{"city":"Rome","days":3}'],
        ['{"city":3}', '{"days":3}', '{"city":"Paris","x":1}', '{"city":"Montevideo"}'],
    ),
    "regex": (
        {"type": "regex", "pattern": "[A-Z]{3}-[0-9]{4}|none"},
        ["ABC-1234", "none"],
        ["AB-1"],
    ),
    "any_text": (
        {"type": "any_text", "excludes": ["<stop>", "!!"]},
        ["", "free\ntext <sto", "a!b!"],
        ["<stop>", "x<stop>y", "wow!!"],
    ),
    "sequence": (
        {"type": "sequence", "elements": [const("A: "), {"type": "regex", "pattern": "[0-9]+"}]},
        ["A: 12"],
        ["A: ", "12", "A: 1x"],
    ),
    "grammar": (
        {"type": "grammar", "grammar": 'root ::= answer " " [0-9]+\nanswer ::= "yes" | "no"'},
        ["yes 12", "no 0"],
        ["maybe 1", "yes ", "yes12"],
    ),
    "or": ({"type": "or", "elements": [const("yes"), const("no")]}, ["yes", "no"], ["", "yesno"]),
    "optional": ({"type": "optional", "content": const("x")}, ["", "x"], ["xx"]),
    "plus": ({"type": "plus", "content": const("ab")}, ["ab", "abab"], ["", "aba"]),
    "star": ({"type": "star", "content": const("ab")}, ["", "abab"], ["a"]),
    "repeat": (
        {"type": "repeat", "min": 2, "max": 3, "content": const("z")},
        ["zz", "zzz"],
        ["z", "zzzz"],
    ),
    "repeat unbounded": (
        {"type": "repeat", "min": 1, "max": -1, "content": const("z")},
        ["z", "zzzzz"],
        [""],
    ),
    "tag": (
        tag("<r>", {"type": "json_schema", "json_schema": PING}, ["</r>", "</answer>"]),
        ["<r>{}</r>", "<r>{}</answer>", "<r>{ }\n</r>"],
        ["<r>{}", "{}</r>", "<r>{}}</r>"],
    ),
    # any_text inside a tag stops at the tag's end: the first "</think>" closes the thought.
    "thought": (
        {"type": "sequence", "elements": [THINK, const("A")]},
        ["<think>hm\n</think>A", "<think></think>A", "<think>a</think</think>A"],
        ["<think>a</think>b</think>A", "<think>a</think>"],
    ),
    "tags_with_separator": (
        {"type": "tags_with_separator", "tags": [call_tag("ping")], "separator": ","},
        [
            "",
            "<function=ping>{}</function>",
            "<function=ping>{}</function>,<function=ping>{}</function>",
        ],
        ["<function=ping>{}</function>,", "x<function=ping>{}</function>"],
    ),
    "tags_with_separator one": (
        {
            "type": "tags_with_separator",
            "tags": [call_tag("ping")],
            "separator": ",",
            "at_least_one": True,
            "stop_after_first": True,
        },
        ["<function=ping>{}</function>"],
        ["", "<function=ping>{}</function>,<function=ping>{}</function>"],
    ),
    "dispatch": (
        {"type": "dispatch", "rules": [["#n=", {"type": "regex", "pattern": "[0-9]+;"}]]},
        ["", "a #n=12; b #n=3;", "text # n"],
        ["#n=x", "a #n=1"],
    ),
    "dispatch once": (
        {
            "type": "dispatch",
            "rules": [["#n=", {"type": "regex", "pattern": "[0-9]+;"}]],
            "loop": False,
            "excludes": ["STOP"],
        },
        ["a #n=12;", "plain"],
        ["a #n=12; b", "x STOP"],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_format_matches_its_language(name):
    fmt, accepted, refused = CASES[name]
    pattern = regex_of(fmt)
    for text in accepted:
        assert pattern.fullmatch(text), (name, text)
    for text in refused:
        assert not pattern.fullmatch(text), (name, text)


def test_max_whitespace_cnt_bounds_each_gap():
    fmt = {"type": "json_schema", "json_schema": WEATHER, "max_whitespace_cnt": 2}
    pattern = regex_of(fmt)
    assert pattern.fullmatch('{ "city":  "Paris"\n}')
    assert not pattern.fullmatch('{"city":   "Paris"}')
    default = regex_of({"type": "json_schema", "json_schema": WEATHER})
    assert default.fullmatch('{\n  "city": "Paris"\n}\n')


def test_the_json_examples_are_what_they_say():
    _, accepted, refused = CASES["json_schema"]
    for text in accepted:
        jsonschema.validate(json.loads(text), WEATHER)
    for text in refused:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(json.loads(text), WEATHER)


# ---- triggered tags, against a reference reader ------------------------------------------------


def compact(arguments: dict, schema: dict) -> str:
    """JSON compact, properties in the schema's order (braid's order)."""
    ordered = {k: arguments[k] for k in schema["properties"] if k in arguments}
    ordered |= {k: v for k, v in arguments.items() if k not in ordered}
    return json.dumps(ordered, ensure_ascii=False, separators=(",", ":"))


def read_calls(text: str, excludes: tuple[str, ...] = ()) -> list[tuple[str, dict, int]] | None:
    """The calls in `text` as XGrammar's triggered_tags reads it: free text up to each
    trigger, which must begin a tag of a known function whose arguments validate (their
    properties in the schema's order); each call's name, arguments and where it ends. None
    where the text is not in the language."""
    found, at = [], 0
    while True:
        start = text.find(TRIGGER, at)
        free = text[at:] if start < 0 else text[at:start]
        if any(word in free for word in excludes):
            return None
        if start < 0:
            return found
        for name, schema in SCHEMAS.items():
            begin = f"{TRIGGER}{name}>"
            end = text.find(END, start)
            if text.startswith(begin, start) and end >= 0:
                arguments = text[start + len(begin) : end]
                try:
                    value = json.loads(arguments)
                    jsonschema.validate(value, schema)
                except (ValueError, jsonschema.ValidationError):
                    return None
                written = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
                if written != compact(value, schema):
                    return None
                at = end + len(END)
                found.append((name, value, at))
                break
        else:
            return None


FREE = ["", "Sure. ", "<func", "<function", "function=", "<", "\n", "</function>", "ok"]
ARGUMENTS = ['{"city":"Paris"}', '{"city":"Rome","days":2}', '{"city":1}', "{}", '{"x":1}']
pieces = st.lists(
    st.one_of(
        st.sampled_from(FREE),
        st.tuples(st.sampled_from([*SCHEMAS, "unknown"]), st.sampled_from(ARGUMENTS)),
    ),
    max_size=5,
)
flag_sets = st.fixed_dictionaries(
    {"at_least_one": st.booleans(), "stop_after_first": st.booleans()}
)


def joined(parts: list) -> str:
    return "".join(p if isinstance(p, str) else f"{TRIGGER}{p[0]}>{p[1]}{END}" for p in parts)


@settings(max_examples=200, deadline=None)
@given(pieces, flag_sets)
def test_triggered_tags_hold_what_the_reference_reads(parts, flags):
    text = joined(parts)
    read = read_calls(text)
    held = read is not None
    if held and flags["at_least_one"]:  # a call first, no text before it
        held = bool(read) and text.startswith(TRIGGER)
    if held and flags["stop_after_first"] and read:  # one call, nothing after it
        held = len(read) == 1 and read[0][2] == len(text)
    assert bool(regex_of(calls(**flags)).fullmatch(text)) == held, (flags, text)


def test_triggered_tags_exclude_their_words_and_the_end_around_them():
    fmt = tag("<calls>", calls(excludes=["DONE"]), "</calls>")
    pattern = regex_of(fmt)
    inside = (
        'Calling. <function=ping>{}</function> and <function=get_weather>{"city":"Oslo"}</function>'
    )
    assert pattern.fullmatch(f"<calls>{inside}</calls>")
    assert read_calls(inside, ("DONE", "</calls>")) is not None
    for text in (f"<calls>DONE {inside}</calls>", "<calls>a</calls>b</calls>"):
        assert not pattern.fullmatch(text), text


def test_the_legacy_form_is_triggered_tags():
    legacy = {
        "type": "structural_tag",
        "structures": [
            {"begin": f"{TRIGGER}{name}>", "schema": SCHEMAS[name], "end": END} for name in SCHEMAS
        ],
        "triggers": [TRIGGER],
    }
    assert StructuralTag.of(legacy) == StructuralTag.of({"format": calls()})
    assert StructuralTag.of(json.dumps(legacy)) == StructuralTag.of(legacy)
    assert hash(StructuralTag.of(legacy)) == hash(StructuralTag.of({"format": calls()}))


# ---- compiled: outputs written over the masks ----------------------------------------------


def walk(grammar, rng: random.Random, max_steps: int = 160) -> str | None:
    """A seeded random walk over the masks, steered towards short tokens and the end after a
    while; None if it did not end."""
    vocab, eos = grammar.vocab, min(grammar.vocab.eos_token_ids)
    matcher = grammar.matcher()
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    out = b""
    for step in range(max_steps):
        matcher.fill_bitmask(row)
        allowed = allowed_token_ids(row)
        assert allowed, f"dead end after {out!r}"
        if eos in allowed and (step > 20 or len(allowed) == 1 or rng.random() < 0.2):
            assert matcher.accept_token(eos) and matcher.is_terminated()
            return out.decode("utf-8")
        tokens = [t for t in allowed if t != eos]
        if step > 30:
            tokens = sorted(tokens, key=lambda t: len(vocab.token_bytes[t]))[:40]
        token = rng.choice(tokens)
        assert matcher.accept_token(token)
        out += vocab.token_bytes[token]
    return None


@pytest.mark.parametrize("stop_after_first", [False, True])
def test_walks_write_calls_that_validate(vocab, stop_after_first):
    tag = StructuralTag.of({"format": calls(at_least_one=True, stop_after_first=stop_after_first)})
    grammar = grammars.compile(tag, vocab)
    ended = 0
    for seed in range(4):
        out = walk(grammar, random.Random(seed))
        if out is None:
            continue
        ended += 1
        read = read_calls(out)
        assert read, out  # at least one call, each one's arguments valid under its schema
        for name, arguments, _ in read:
            jsonschema.validate(arguments, SCHEMAS[name])
        assert out.startswith(TRIGGER) and (not stop_after_first or len(read) == 1), out
    assert ended >= 2


def test_compiled_masks_take_the_language(vocab, feeds):
    grammar = grammars.compile(StructuralTag.of({"format": calls()}), vocab)
    assert feeds(grammar, 'Let me check. <function=get_weather>{"city":"Paris"}</function>')
    assert feeds(grammar, "No call needed.")
    assert not feeds(grammar, "<function=get_weather>{}</function>")
    assert not feeds(grammar, "<function=nope>{}</function>")


# ---- refusals name their path ---------------------------------------------------------------


REFUSALS = [
    (
        calls() | {"tags": [call_tag("ping"), tag("<function=x>", {"type": "foo"}, END)]},
        r"^structural_tag\.format\.tags\[1\]\.content\.type: unknown format 'foo'$",
    ),
    (
        {"type": "const_string", "value": "a", "values": 1},
        r"^structural_tag\.format\.values: unknown field",
    ),
    ({"value": "a"}, r"^structural_tag\.format\.type: missing"),
    ({"type": "const_string"}, r"^structural_tag\.format\.value: missing"),
    ({"type": "grammar", "grammar": 'start: "a"'}, r"^structural_tag\.format\.grammar: must be"),
    (
        {"type": "grammar", "grammar": "root ::= item\nitem ::= [a-z] missing"},
        r"^structural_tag\.format\.grammar: .*undefined `missing`",
    ),
    ({"type": "token", "token": 7}, r"^structural_tag\.format\.type: format 'token'"),
    (
        {"type": "sequence", "elements": [const("a"), {"type": "any_tokens"}]},
        r"^structural_tag\.format\.elements\[1\]\.type: format 'any_tokens'",
    ),
    (
        {"type": "json_schema", "json_schema": PING, "style": "qwen_xml"},
        r"^structural_tag\.format\.style: 'qwen_xml' is not supported",
    ),
    (
        {"type": "json_schema", "json_schema": PING, "any_order": True},
        r"^structural_tag\.format\.any_order: true is not supported",
    ),
    ({"type": "any_text", "max_tokens": 10}, r"^structural_tag\.format\.max_tokens: not supported"),
    (
        tag("<a>", const("x"), {"type": "token", "token": "</a>"}),
        r"^structural_tag\.format\.end: a token end is not supported",
    ),
    (
        calls() | {"tags": [tag("<tool>", const("x"), "</tool>")]},
        r"^structural_tag\.format\.tags\[0\]\.begin: '<tool>' starts with no trigger",
    ),
    (
        calls() | {"triggers": ["<f", "<fun"]},
        r"^structural_tag\.format\.tags\[0\]\.begin: .* starts with several triggers",
    ),
    (
        {"type": "triggered_tags", "triggers": [TRIGGER], "tags": [const("x")]},
        r"^structural_tag\.format\.tags\[0\]\.type: must be 'tag'",
    ),
    ({"type": "or", "elements": []}, r"^structural_tag\.format\.elements: must not be empty"),
    (
        {"type": "repeat", "min": 3, "max": 2, "content": const("x")},
        r"^structural_tag\.format\.max: must be -1",
    ),
    ({"type": "regex", "pattern": "(a"}, r"^structural_tag\.format\.pattern: invalid regex"),
    (
        {"type": "any_text", "excludes": [""]},
        r"^structural_tag\.format\.excludes\[0\]: must not be empty",
    ),
    (
        {"type": "json_schema", "json_schema": "{}"},
        r"^structural_tag\.format\.json_schema: must be an object or a boolean",
    ),
]


@pytest.mark.parametrize("fmt, message", REFUSALS)
def test_refusals_name_the_path(fmt, message):
    with pytest.raises(ValueError, match=message):
        StructuralTag.of({"type": "structural_tag", "format": fmt})


def test_top_level_and_legacy_refusals():
    cases = [
        ({"type": "json_schema", "format": const("a")}, r"^structural_tag\.type: must be"),
        ({"type": "structural_tag"}, r"^structural_tag: needs a format"),
        ("{not json", r"^structural_tag is not valid JSON"),
        ([1], r"^structural_tag must be an object"),
        (
            {"structures": [{"begin": "<a>", "schema": PING, "end": "</a>"}], "triggers": ["<b"]},
            r"^structural_tag\.structures\[0\]\.begin: '<a>' starts with no trigger",
        ),
        (
            {"structures": [{"begin": "<a>", "end": "</a>"}], "triggers": ["<a"]},
            r"^structural_tag\.structures\[0\]\.schema: missing",
        ),
        (
            {"format": json.loads('{"type":"optional","content":' * 130 + "{}" + "}" * 130)},
            "nested",
        ),
    ]
    for tag, message in cases:
        with pytest.raises(ValueError, match=message):
            StructuralTag.of(tag)


def test_a_grammar_whose_rules_recurse_is_refused_by_its_path():
    fmt = tag("<p>", {"type": "grammar", "grammar": 'root ::= "(" root ")" | "x"'}, "</p>")
    with pytest.raises(ValueError, match=r"^structural_tag\.format\.content\.grammar: a rule"):
        structural_tag_regex(StructuralTag.of({"format": fmt}))


def test_a_schema_braid_cannot_compile_is_named_by_its_path():
    fmt = tag("<a>", {"type": "json_schema", "json_schema": {"type": "nope"}}, "</a>")
    with pytest.raises(ValueError, match=r"^structural_tag\.format\.content\.json_schema: .*nope"):
        structural_tag_regex(StructuralTag.of({"format": fmt}))
