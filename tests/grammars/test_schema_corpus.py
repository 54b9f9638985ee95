"""The JSON-schema corpus (tests/data/schemas) against jsonschema, the reference validator.

Each file says whether its schema must compile or be refused (and with what message), and
lists instances labelled valid or invalid. The labels are checked with jsonschema; then each
instance, written compactly with properties in schema order, is fed token by token to a
fresh matcher that fills the mask before every token: a valid one must reach EOS, an invalid
one must be refused somewhere. Random walks over the masks must write documents jsonschema
accepts, and so must text drawn from a schema's regex where the converter narrows branches.
"""

from __future__ import annotations

import datetime
import json
import random
import re
from decimal import Decimal

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema.validators import validator_for

from braid import grammars
from braid.grammars.json_schema.convert import schema_to_regex
from braid.grammars.matcher import allowed_token_ids
from braid.runtime.cli.bench.grammar_cases import CORPUS_DIR, feed, load_corpus, serialize
from braid.runtime.cli.bench.grammar_corpus import schema_features

CASES = {case.name: case for case in load_corpus(CORPUS_DIR)}
COMPILED = [name for name, case in CASES.items() if case.expect == "compiled"]
REJECTED = [name for name, case in CASES.items() if case.expect == "rejected"]

# jsonschema checks these formats only with optional packages: reference checks of our own
# (uri and uri-reference it checks with rfc3986-validator, a test dependency).
FORMATS = jsonschema.FormatChecker()
_TIME = re.compile(r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)")


@FORMATS.checks("time")
def _is_time(value: object) -> bool:
    return not isinstance(value, str) or bool(_TIME.fullmatch(value))


@FORMATS.checks("date-time", raises=ValueError)
def _is_date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    date, sep, time = value.partition("T") if "T" in value else value.partition("t")
    if not (sep and re.fullmatch(r"\d{4}-\d{2}-\d{2}", date)):
        return False
    return bool(datetime.date.fromisoformat(date)) and _is_time(time)


@FORMATS.checks("duration")
def _is_duration(value: object) -> bool:
    """RFC 3339 appendix A read unit by unit: the date units a run of Y, M, D (or W alone),
    the time units after T a non-empty run of H, M, S."""
    if not isinstance(value, str):
        return True
    if not value.startswith("P"):
        return False
    date, has_time, time = value[1:].partition("T")

    def units(text: str) -> str | None:
        found = re.findall(r"([0-9]+)([A-Z])", text)
        return "".join(u for _, u in found) if "".join(map("".join, found)) == text else None

    date_units, time_units = units(date), units(time)
    if date_units is None or time_units is None or (has_time and not time_units):
        return False
    if date_units == "W":
        return not has_time
    return (date_units or time_units) != "" and date_units in "YMD" and time_units in "HMS"


def _decimal_multiple_of(validator, step, instance, schema):
    """multipleOf as the spec reads it, in decimal: jsonschema divides binary floats, so
    0.07 is not a multiple of 0.01 there (0.07 / 0.01 == 7.000000000000001)."""
    if validator.is_type(instance, "number") and Decimal(repr(instance)) % Decimal(repr(step)):
        yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {step!r}")


def validator(schema):
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    cls = jsonschema.validators.extend(cls, {"multipleOf": _decimal_multiple_of})
    return cls(schema, format_checker=FORMATS)


def test_corpus_spans_the_features():
    assert len(CASES) >= 60
    used = set().union(*(schema_features(c.schema) for c in CASES.values()))
    wanted = {
        "properties", "required", "additionalProperties", "minItems", "maxItems", "enum",
        "const", "anyOf", "oneOf", "allOf", "$ref", "pattern", "format:date",
        "format:date-time", "format:email", "format:uuid", "minimum", "maximum", "nullable",
        "patternProperties", "not",
    }  # fmt: skip
    assert wanted <= used, wanted - used
    reasons = " ".join(CASES[name].reject_reason for name in REJECTED)
    for keyword in (
        "may both match",
        "uniqueItems",
        "'if'",
        "unsatisfiable",
    ):
        assert keyword in reasons


@pytest.mark.parametrize("name", sorted(CASES))
def test_instances_are_labelled_right(name):
    case = CASES[name]
    valid = [d for ok, d in case.tests if ok]
    invalid = [d for ok, d in case.tests if not ok]
    if case.expect == "compiled":
        assert len(valid) >= 3 and len(invalid) >= 2
    else:
        assert case.expect == "rejected" and case.reject_reason
    cls = validator_for(case.schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(case.schema)
    except jsonschema.SchemaError:
        assert not case.tests  # a malformed schema judges nothing
        return
    check = validator(case.schema)
    for data in valid:
        check.validate(data)
    for data in invalid:
        assert not check.is_valid(data), data


@pytest.mark.parametrize("name", REJECTED)
def test_refused_with_a_clear_error(name, vocab):
    case = CASES[name]
    with pytest.raises(ValueError, match=re.escape(case.reject_reason)):
        grammars.compile(grammars.JsonSchema.of(case.schema), vocab)


@pytest.mark.parametrize("name", COMPILED)
def test_valid_accepted_invalid_refused(name, tokenizer, vocab):
    case = CASES[name]
    grammar = grammars.compile(grammars.JsonSchema.of(case.schema), vocab)
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    for valid, data in case.tests:
        text = serialize(data, case.schema)
        ids = tokenizer.encode(text, add_special_tokens=False)
        refused_at, _ = feed(grammar.matcher(), ids, tokenizer.eos_token_id, row)
        if valid:
            assert refused_at is None, f"{text!r} refused at token {refused_at}"
        else:
            assert refused_at is not None, f"invalid {text!r} accepted"


def test_serialize_follows_schema_order():
    schema = {
        "type": "object",
        "properties": {"b": {"$ref": "#/$defs/inner"}, "a": {"type": "integer"}},
        "$defs": {"inner": {"properties": {"y": {}, "x": {}}}},
    }
    data = {"extra": 0, "a": 1, "b": {"x": 2, "y": "é"}}
    assert serialize(data, schema) == '{"b":{"y":"é","x":2},"a":1,"extra":0}'


WALKED = ["invoice", "tool_choice", "recursive_tree", "k8s_service", "enum_mixed", "geo_point"]


@pytest.mark.parametrize("name", WALKED)
def test_random_walks_write_valid_documents(name, vocab):
    """Seeded walks over the mask: uniform over allowed tokens, closing strings and
    containers once the text grows long, EOS as soon as it is allowed."""
    case = CASES[name]
    grammar = grammars.compile(grammars.JsonSchema.of(case.schema), vocab)
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    eos = min(vocab.eos_token_ids)
    check = validator(case.schema)
    rng = random.Random(name)
    finished = 0
    for _ in range(4):
        matcher, out = grammar.matcher(), b""
        for step in range(400):
            matcher.fill_bitmask(row)
            allowed = allowed_token_ids(row)
            assert allowed, f"dead end after {out!r}"
            if eos in allowed:
                assert matcher.accept_token(eos)
                break
            closers = [t for t in allowed if set(vocab.token_bytes[t]) & set(b'"]}')]
            token = rng.choice(closers if step > 30 and closers else allowed)
            assert matcher.accept_token(token)
            out += vocab.token_bytes[token]
        else:
            continue
        check.validate(json.loads(out.decode("utf-8")))
        finished += 1
    assert finished >= 2


# oneOf branches are narrowed so that no two can match one value: text drawn from the regex
# (not just the valid instances listed) must validate, or a narrowing let an overlap through.
# Property dependencies and conditions (if/then/else) become alternatives the same way,
# counted patterns are rebuilt, values are cut out of `not`, and formats and counted strings
# are regexes of our own, checked against the reference checkers.
DRAWN = sorted(
    name
    for name in COMPILED
    if name.startswith(
        ("one_of", "depend", "pattern_with", "format_", "string_length", "if_", "not_values")
    )
    and "lookahead" not in name
)


@pytest.mark.parametrize("name", DRAWN)
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_narrowed_regex_writes_only_valid_documents(name, data):
    schema = CASES[name].schema
    text = data.draw(st.from_regex(_regex(name), fullmatch=True))
    validator(schema).validate(json.loads(text))


_REGEXES: dict[str, str] = {}


def _regex(name: str) -> str:
    if name not in _REGEXES:
        _REGEXES[name] = schema_to_regex(CASES[name].schema)
    return _REGEXES[name]
