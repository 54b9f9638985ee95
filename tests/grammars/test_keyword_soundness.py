"""Every keyword of JSON Schema draft-07, 2019-09 and 2020-12, implemented or refused by name.

For each keyword braid implements, schemas of our own (read from the specification's text,
not from MaskBench) with instances that jsonschema judges: every invalid instance must be
refused by the masks, the valid ones listed must get through (braid writes compact JSON
with properties in the schema's order, so these are written that way), and seeded random
walks over the masks must write documents jsonschema accepts. Every keyword braid refuses
is refused with an error that names it. docs/json-schema.md has the table; a keyword
missing from it or from the cases below fails this test.
"""

from __future__ import annotations

import functools
import json
import random
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch
from jsonschema.validators import validator_for

from braid import grammars
from braid.runtime.cli.bench.grammar import serialize

D7 = "http://json-schema.org/draft-07/schema#"
D2019 = "https://json-schema.org/draft/2019-09/schema"
D2020 = "https://json-schema.org/draft/2020-12/schema"
DOC = Path(__file__).resolve().parents[2] / "docs" / "json-schema.md"

# The keywords of the three drafts (core, applicator, unevaluated, validation, format,
# content and meta-data vocabularies; draft-07's and 2019-09's own spellings).
KEYWORDS = {
    "$schema", "$id", "$ref", "$anchor", "$dynamicRef", "$dynamicAnchor", "$recursiveRef",
    "$recursiveAnchor", "$vocabulary", "$comment", "$defs", "definitions",
    "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "dependencies",
    "prefixItems", "items", "additionalItems", "contains", "properties", "patternProperties",
    "additionalProperties", "propertyNames", "unevaluatedItems", "unevaluatedProperties",
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems",
    "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required",
    "dependentRequired", "format", "contentEncoding", "contentMediaType", "contentSchema",
    "title", "description", "default", "deprecated", "readOnly", "writeOnly", "examples",
}  # fmt: skip

POSITIVE = {"type": "integer", "minimum": 1}
NODE = {  # a recursive tree, for the reference keywords
    "type": "object",
    "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "maxItems": 2}},
    "required": ["v"],
    "additionalProperties": False,
}

# keyword -> [(schema, instances that must get through, instances that must be refused)]
CASES: dict[str, list[tuple]] = {
    "$ref": [
        ({"$defs": {"p": POSITIVE}, "$ref": "#/$defs/p"}, [1, 7], [0, "1", 1.5]),
        ({"$defs": {"p": POSITIVE}, "$ref": "#/$defs/p", "maximum": 3}, [3], [4]),
        (
            {"$defs": {"a b": {"const": 1}}, "$ref": "#/$defs/a%20b"},  # percent-encoded
            [1],
            [2],
        ),
    ],
    "$defs": [({"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s"}, ["x"], [1])],
    "definitions": [
        (
            {"$schema": D7, "definitions": {"s": {"type": "string"}}, "$ref": "#/definitions/s"},
            ["a"],
            [1],
        ),
    ],  # fmt: skip
    "$anchor": [({"$defs": {"p": {**POSITIVE, "$anchor": "pos"}}, "$ref": "#pos"}, [2], [0])],
    "$id": [
        (  # inside an embedded resource, "#/$defs/c" is that resource's
            {
                "$id": "https://example.com/root",
                "$defs": {
                    "b": {"$id": "b", "$defs": {"c": {"type": "string"}}, "$ref": "#/$defs/c"},
                    "c": {"type": "integer"},
                },
                "$ref": "b",
            },
            ["s"],
            [1],
        ),
        (
            {
                "$id": "https://example.com/r",
                "$defs": {"a": {"const": 1}},
                "$ref": "https://example.com/r#/$defs/a",
            },
            [1],
            [2],
        ),  # fmt: skip
        (
            {"$schema": D7, "definitions": {"a": {"$id": "#one", "const": 1}}, "$ref": "#one"},
            [1],
            [2],
        ),  # fmt: skip
    ],
    "$dynamicRef": [
        (
            {
                "$schema": D2020,
                "$dynamicAnchor": "node",
                **NODE,
                "properties": {
                    "v": {"type": "integer"},
                    "kids": {"type": "array", "maxItems": 2, "items": {"$dynamicRef": "#node"}},
                },
            },
            [{"v": 1}, {"v": 1, "kids": [{"v": 2}]}],
            [{"v": "x"}, {"v": 1, "kids": [{"v": "a"}]}, {"kids": []}],
        ),
    ],
    "$recursiveRef": [
        (
            {
                "$schema": D2019,
                "$recursiveAnchor": True,
                **NODE,
                "properties": {
                    "v": {"type": "integer"},
                    "kids": {"type": "array", "maxItems": 2, "items": {"$recursiveRef": "#"}},
                },
            },
            [{"v": 1, "kids": [{"v": 2}]}],
            [{"v": 1, "kids": [{"w": 2}]}, {"v": 1.5}],
        ),
    ],
    "allOf": [
        ({"allOf": [{"type": "integer"}, {"minimum": 2}, {"maximum": 4}]}, [2, 4], [1, 5, "3"]),
        (
            {
                "allOf": [
                    {"properties": {"a": {"type": "integer"}}, "additionalProperties": False},
                    {"properties": {"b": {}}},
                ]
            },
            [{"a": 1}],
            [{"b": 1}, {"a": "x"}],
        ),  # fmt: skip
        (
            {"allOf": [{"prefixItems": [{"type": "integer"}]}, {"items": {"maximum": 5}}]},
            [[1, 2]],
            [[7], ["a"], [1, 9]],
        ),
    ],
    "anyOf": [({"anyOf": [{"type": "string"}, {"type": "null"}]}, ["a", None], [1, [], {}])],
    "oneOf": [
        ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, [1, "a"], [1.5, None]),
        ({"oneOf": [{"const": 1}, {"const": 2}, {"type": "boolean"}]}, [1, 2, True], [3]),
        # Overlapping branches, each written without what the other accepts.
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, [1.5], [1, 1.0, "a"]),
        ({"oneOf": [{"enum": [1, 2]}, {"type": "integer", "maximum": 5}]}, [3, 0], [1, 2, 6]),
        ({"oneOf": [{"type": "string"}, {"const": "x"}]}, ["y"], ["x"]),
    ],
    "not": [
        ({"type": "integer", "not": {"enum": [1, 2]}}, [0, 3], [1, 2]),
        ({"type": ["string", "null"], "not": {"type": "null"}}, ["a"], [None]),
        ({"type": "number", "not": {"type": "integer"}}, [1.5, -0.25], [1, 1.0, -3]),
        (
            {"type": "object", "not": {"required": ["a", "b"]}, "properties": {"a": {}, "b": {}}},
            [{"b": 1}],
            [{"a": 1, "b": 2}],
        ),  # fmt: skip (a is never written: stricter)
    ],
    "if": [
        (
            {
                "type": "object",
                "properties": {"k": {"enum": ["n", "s"]}, "v": {}},
                "required": ["k", "v"],
                "if": {"properties": {"k": {"const": "n"}}},
                "then": {"properties": {"v": {"type": "number"}}},
                "else": {"properties": {"v": {"type": "string"}}},
            },
            [{"k": "n", "v": 1}, {"k": "s", "v": "x"}],
            [{"k": "n", "v": "x"}, {"k": "s", "v": 1}],
        ),  # fmt: skip
        ({"if": {"type": "string"}, "type": "integer"}, [1], ["a"]),  # no then/else: no-op
    ],
    "then": [({"then": {"type": "string"}, "type": "integer"}, [1], ["a"])],  # no if: no-op
    "else": [({"else": {"type": "string"}, "type": "integer"}, [1], ["a"])],
    "dependentSchemas": [
        (
            {
                "type": "object",
                "properties": {"a": {}, "b": {"type": "integer"}},
                "dependentSchemas": {"a": {"required": ["b"]}},
            },
            [{"a": 1, "b": 2}, {"b": 2}, {}],
            [{"a": 1}, {"a": 1, "b": "x"}],
        ),  # fmt: skip
    ],
    "dependencies": [
        (
            {
                "$schema": D7,
                "type": "object",
                "properties": {"a": {}, "b": {}, "c": {}},
                "dependencies": {"a": ["b"], "c": {"properties": {"b": {"const": 0}}}},
            },
            [{"a": 1, "b": 2}, {"b": 0, "c": 1}, {}],
            [{"a": 1}, {"b": 1, "c": 1}],
        ),  # fmt: skip
        (  # six rules, five of them free: a required trigger or a required dependent
            {
                "type": "object",
                "properties": {n: {"type": "integer"} for n in "abcdefg"},
                "required": ["a", "g"],
                "additionalProperties": False,
                "dependentRequired": {
                    "a": ["b"],
                    "b": ["g"],
                    "c": ["g"],
                    "d": ["g"],
                    "e": ["g"],
                    "f": ["e"],
                },
            },
            [{"a": 1, "b": 2, "g": 0}, {"a": 1, "b": 2, "e": 1, "f": 1, "g": 0}],
            [{"a": 1, "g": 0}, {"a": 1, "b": 2, "f": 1, "g": 0}],
        ),  # fmt: skip
    ],
    "prefixItems": [
        (
            {"prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
            [[], [1], [1, "a"]],
            [["a"], [1, 2], [1, "a", 3]],
        ),
        (
            {
                "prefixItems": [{"type": "integer"}],
                "items": {"type": "boolean"},
                "minItems": 2,
                "maxItems": 3,
            },
            [[1, True], [1, True, False]],
            [[1], [1, 2], [1, True, True, True], [True, True]],
        ),  # fmt: skip
    ],
    "items": [
        (
            {"items": {"type": "integer"}, "minItems": 1, "maxItems": 2},
            [[1], [1, 2]],
            [[], [1, 2, 3], ["a"]],
        ),  # fmt: skip
        (
            {"$schema": D7, "items": [{"type": "integer"}, {"type": "string"}]},
            [[1], [1, "a"], [1, "a", None]],
            [["a"], [1, 2]],
        ),  # fmt: skip
        ({"items": False}, [[]], [[1]]),
    ],
    "additionalItems": [
        (
            {
                "$schema": D2019,
                "items": [{"type": "integer"}],
                "additionalItems": {"type": "string"},
            },
            [[1, "a", "b"]],
            [[1, 2], ["a"]],
        ),  # fmt: skip
        ({"$schema": D7, "items": [{"const": 0}], "additionalItems": False}, [[0], []], [[0, 0]]),
    ],
    "contains": [
        (
            {"items": {"type": "integer"}, "contains": {"const": 0}},
            [[0], [1, 0], [0, 0, 3]],
            [[], [1, 2]],
        ),  # fmt: skip
        (
            {"items": {"type": "integer"}, "contains": {"const": 0}, "maxItems": 3},
            [[0], [0, 5]],
            [[], [1], [0, 1, 2, 3]],
        ),  # fmt: skip
    ],
    "minContains": [
        (
            {"items": {"type": "integer"}, "contains": {"const": 0}, "minContains": 2},
            [[0, 0], [1, 0, 2, 0]],
            [[0], [1, 0, 1]],
        ),  # fmt: skip
        (
            {"items": {"type": "integer"}, "contains": {"const": 0}, "minContains": 0},
            [[], [1]],
            [["a"]],
        ),  # fmt: skip
        ({"minContains": 2, "type": "array", "items": {"type": "boolean"}}, [[], [True]], [[1]]),
    ],
    "maxContains": [
        (
            {"items": {"type": "integer"}, "contains": {"const": 0}, "maxContains": 1},
            [[0], [1, 0, 2]],
            [[0, 0], [], [1, 0, 0]],
        ),  # fmt: skip
        (
            {
                "items": {"enum": ["a", "b"]},
                "contains": {"const": "a"},
                "minContains": 0,
                "maxContains": 1,
            },
            [[], ["b", "b"], ["a", "b"]],
            [["a", "a"], ["b", "a", "a"]],
        ),  # fmt: skip
    ],
    "properties": [
        (
            {"properties": {"a": {"type": "integer"}, "b": False}},
            [{"a": 1}, {}],
            [{"a": "x"}, {"b": 1}],
        ),  # fmt: skip
    ],
    "patternProperties": [
        (
            {"patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False},
            [{"x-a": 1}, {}],
            [{"x-a": "s"}, {"y": 1}],
        ),  # fmt: skip
    ],
    "additionalProperties": [
        (
            {"properties": {"a": {}}, "additionalProperties": {"type": "integer"}},
            [{"a": "x", "b": 1}],
            [{"a": 1, "b": "x"}],
        ),  # fmt: skip
        ({"properties": {"a": {}}, "additionalProperties": False}, [{"a": 1}], [{"b": 1}]),
    ],
    "propertyNames": [
        (
            {"propertyNames": {"pattern": "^[a-z]+$"}, "additionalProperties": {"type": "integer"}},
            [{}, {"a": 1}, {"abc": 2, "d": 3}],
            [{"A": 1}, {"a": "1"}, {"a1": 1}],
        ),  # fmt: skip
        (
            {"propertyNames": {"enum": ["a", "b"]}, "additionalProperties": {"type": "integer"}},
            [{"a": 1}, {"a": 1, "b": 2}],
            [{"c": 1}, {"a": "x"}],
        ),  # fmt: skip
        (
            {"properties": {"ok": {}, "BAD": {}}, "propertyNames": {"maxLength": 2}},
            [{"ok": 1}],
            [{"BAD": 1}],
        ),  # fmt: skip
        ({"propertyNames": False}, [{}], [{"a": 1}]),
    ],
    "unevaluatedProperties": [
        (
            {"allOf": [{"properties": {"foo": True}}, {"unevaluatedProperties": False}]},
            [{}],
            [{"foo": 1}],
        ),  # fmt: skip
        (
            {"allOf": [{"properties": {"foo": True}}], "unevaluatedProperties": False},
            [{"foo": 1}],
            [{"bar": 1}],
        ),  # fmt: skip
        (
            {
                "allOf": [
                    {"properties": {"a": True}, "unevaluatedProperties": False},
                    {"properties": {"b": True}},
                ]
            },
            [{"a": 1}],
            [{"b": 1}, {"a": 1, "b": 2}],
        ),  # fmt: skip
        (
            {
                "type": "object",
                "properties": {"k": {"enum": ["n", "s"]}},
                "required": ["k"],
                "if": {"properties": {"k": {"const": "n"}}},
                "then": {"properties": {"n": {}}},
                "unevaluatedProperties": False,
            },
            [{"k": "s"}, {"k": "n"}],
            [{"k": "s", "n": 1}, {"k": "s", "z": 1}],
        ),  # fmt: skip
        (
            {"properties": {"a": {}}, "unevaluatedProperties": {"type": "integer"}},
            [{"a": "x"}],
            [{"a": "x", "b": "y"}],
        ),  # fmt: skip
    ],
    "unevaluatedItems": [
        ({"unevaluatedItems": False}, [[]], [[1]]),
        (
            {"prefixItems": [{"type": "integer"}], "unevaluatedItems": False},
            [[1], []],
            [[1, 2]],
        ),  # fmt: skip
        (
            {"allOf": [{"prefixItems": [True, True]}], "unevaluatedItems": {"type": "string"}},
            [[1, 2, "c"]],
            [[1, 2, 3]],
        ),  # fmt: skip
        (
            {"anyOf": [{"prefixItems": [{"const": 1}]}], "unevaluatedItems": False},
            [[]],
            [[1, 2], [2]],
        ),  # fmt: skip
    ],
    "type": [
        ({"type": "integer"}, [0, -5], [1.5, "1", True, None]),
        ({"type": "number"}, [1.5, 2], ["1", True]),
        ({"type": "string"}, ["", "a\nb"], [1, None]),
        ({"type": "boolean"}, [True, False], [0, "true"]),
        ({"type": "null"}, [None], [0, "", False]),
        ({"type": "array"}, [[], [1, "a"]], [{}, "[]"]),
        ({"type": "object"}, [{}, {"a": 1}], [[], "{}"]),
        ({"type": ["integer", "null"]}, [1, None], ["a"]),
        ({"type": "string", "nullable": True}, ["a"], [None]),  # OpenAPI's keyword: ignored
    ],
    "enum": [
        (
            {"enum": ["a", 1, None, [1], {"k": True}]},
            ["a", 1, None, [1], {"k": True}],
            ["b", 2, [], {}],
        )
    ],  # fmt: skip
    "const": [({"const": {"a": [1, "x"]}}, [{"a": [1, "x"]}], [{"a": [1]}, {}, 1])],
    "multipleOf": [
        ({"type": "integer", "multipleOf": 1}, [3], [1.5]),
        ({"type": "number", "multipleOf": 0.01}, [0.5, 2], [0.001, 1.005]),
    ],
    "maximum": [({"type": "number", "maximum": 2.5}, [2.5, -1], [2.6, 3])],
    "exclusiveMaximum": [({"type": "integer", "exclusiveMaximum": 3}, [2], [3, 4])],
    "minimum": [({"type": "number", "minimum": -1}, [-1, 0.5], [-1.5, -2])],
    "exclusiveMinimum": [({"type": "number", "exclusiveMinimum": 0}, [0.1, 1], [0, -0.1])],
    "maxLength": [({"type": "string", "maxLength": 2}, ["", "ab", "é\n"], ["abc"])],
    "minLength": [({"type": "string", "minLength": 2}, ["ab"], ["", "a"])],
    "pattern": [
        ({"type": "string", "pattern": "^[a-c]+$"}, ["abc"], ["", "abd"]),
        ({"type": "string", "pattern": "x"}, ["x", "axb"], ["ab"]),  # searched anywhere
    ],
    "maxItems": [({"type": "array", "maxItems": 1}, [[], [1]], [[1, 2]])],
    "minItems": [({"type": "array", "minItems": 2}, [[1, 2]], [[], [1]])],
    "uniqueItems": [
        (
            {"items": {"enum": ["a", "b", "c"]}, "uniqueItems": True},
            [[], ["b", "a"], ["c"]],
            [["a", "a"], ["a", "b", "a"]],
        ),  # fmt: skip
        (
            {"items": {"type": "boolean"}, "uniqueItems": True, "minItems": 2},
            [[True, False]],
            [[True, True], [True]],
        ),  # fmt: skip
        (
            {"items": {"enum": list(range(12))}, "uniqueItems": True},
            [[0, 5, 11]],
            [[1, 1], [0, 0, 5]],
        ),  # fmt: skip (too many orders: written in the enum's order)
        ({"items": {"enum": [1, 1.0, 2]}, "uniqueItems": True}, [[1, 2]], [[1, 1]]),
        ({"uniqueItems": True, "type": "array", "maxItems": 1}, [[], [5]], [[1, 1]]),
    ],
    "maxProperties": [
        (
            {"type": "object", "properties": {"a": {}, "b": {}}, "maxProperties": 2},
            [{"a": 1, "b": 2}],
            [[]],
        ),  # fmt: skip
        (
            {"additionalProperties": {"type": "integer"}, "maxProperties": 1},
            [{"x": 1}],
            [{"x": 1, "y": 2}],
        ),  # fmt: skip
    ],
    "minProperties": [
        ({"properties": {"a": {}, "b": {}}, "minProperties": 1}, [{"a": 1}, {"b": 1}], [{}]),
        ({"additionalProperties": {"type": "integer"}, "minProperties": 1}, [{"x": 1}], [{}]),
    ],
    "required": [
        ({"properties": {"a": {}, "b": {}}, "required": ["b"]}, [{"b": 1}], [{"a": 1}, {}]),
    ],
    "dependentRequired": [
        (
            {"properties": {"a": {}, "b": {}}, "dependentRequired": {"a": ["b"]}},
            [{"a": 1, "b": 2}, {"b": 1}],
            [{"a": 1}],
        ),  # fmt: skip
    ],
    "format": [
        ({"type": "string", "format": "date"}, ["2024-02-29"], ["2023-02-29", "2024-13-01"]),
        ({"type": "string", "format": "ipv4"}, ["10.0.0.1"], ["256.0.0.1", "1.2.3"]),
        (
            {"type": "string", "format": "uuid"},
            ["123e4567-e89b-12d3-a456-426614174000"],
            ["123e4567"],
        ),  # fmt: skip
        ({"type": "string", "format": "email"}, ["a@b.co"], ["a.b.co"]),
        ({"enum": ["2024-01-01", "x"], "format": "date"}, ["2024-01-01"], ["x"]),
        ({"type": "string", "format": "no-such-format"}, ["anything"], [1]),  # an annotation
    ],
    "contentSchema": [
        (
            {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": {"type": "integer"},
            },
            ["x"],
            [1],
        ),  # fmt: skip
    ],
}
# Keywords that never constrain: a schema of only these admits any value.
ANNOTATIONS = [
    "$schema", "$comment", "$vocabulary", "$dynamicAnchor", "$recursiveAnchor",
    "contentEncoding", "contentMediaType", "title", "description", "default", "deprecated",
    "readOnly", "writeOnly", "examples",
]  # fmt: skip

# keyword -> schemas braid refuses, with an error naming the keyword.
REFUSED: dict[str, list] = {
    "uniqueItems": [
        {"items": {"type": "integer"}, "uniqueItems": True},
        {"items": {"enum": [1, 2]}, "uniqueItems": True, "contains": {"const": 1}},
    ],
    "maxContains": [
        {"items": {"type": "integer"}, "contains": {"minimum": 3}, "maxContains": 1},
    ],
    "contains": [{"prefixItems": [{}], "contains": {"const": 1}}],
    "propertyNames": [
        {"patternProperties": {"^a": {}}, "propertyNames": {"maxLength": 3}},
    ],
    "$dynamicRef": [
        {
            "$schema": D2020,
            "$defs": {
                "a": {"$id": "a", "$dynamicAnchor": "x", "type": "string"},
                "b": {"$id": "b", "$dynamicAnchor": "x", "type": "integer"},
            },
            "items": {"$dynamicRef": "a#x"},
        },
    ],
    "$recursiveRef": [
        {
            "$schema": D2019,
            "$defs": {
                "a": {"$id": "a", "$recursiveAnchor": True, "items": {"$recursiveRef": "#"}},
                "b": {"$id": "b", "$recursiveAnchor": True},
            },
            "$ref": "a",
        },
    ],
    "$ref": [{"$ref": "https://example.com/other.json"}, {"$ref": "#/$defs/missing"}],
    "$id": [{"x-vendor": {"$id": "https://example.com/x"}, "type": "integer"}],
    "multipleOf": [{"type": "number", "multipleOf": 0.5}],
    "if": [{"if": {"maximum": 3}, "then": {"type": "integer"}}],
    "not": [{"type": "string", "not": {"pattern": "a"}}],
    "oneOf": [{"oneOf": [{"maximum": 3}, {"minimum": 1}]}],
    "format": [{"type": "string", "format": "idn-email"}],
    "pattern": [{"type": "string", "pattern": "(?=a)"}],
    "minProperties": [{"additionalProperties": {"type": "integer"}, "minProperties": 2}],
    "dependentRequired": [
        {
            "properties": {n: {} for n in "abcdefghij"},
            "dependentRequired": {n: ["j"] for n in "abcde"},
        },
    ],  # fmt: skip
    "unevaluatedProperties": [
        {"anyOf": [{"properties": {"b": {}}}], "unevaluatedProperties": {"type": "integer"}},
    ],
}


def _judge(schema):
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=jsonschema.FormatChecker())


def _text(value, schema) -> str:
    return serialize(value, schema)


CASE_IDS = [(k, i) for k, cases in CASES.items() for i in range(len(cases))]


@pytest.mark.parametrize(("keyword", "i"), CASE_IDS, ids=[f"{k}-{i}" for k, i in CASE_IDS])
def test_invalid_refused_valid_admitted(keyword, i, vocab, feeds):
    schema, valid, invalid = CASES[keyword][i]
    judge = _judge(schema)
    grammar = grammars.compile(grammars.JsonSchema.of(schema), vocab)
    for value in invalid:
        assert not judge.is_valid(value), f"mislabelled: {value!r} is valid"
        assert not feeds(grammar, _text(value, schema)), f"invalid {value!r} admitted"
    for value in valid:
        assert judge.is_valid(value), f"mislabelled: {value!r} is invalid"
        assert feeds(grammar, _text(value, schema)), f"valid {value!r} refused"
    _check_walks(grammar, judge, random.Random(f"{keyword}-{i}"))


def _check_walks(grammar, judge, rng: random.Random, walks: int = 3) -> None:
    """Random walks over the masks (closing strings and containers once long) must write
    documents the judge accepts."""
    vocab = grammar.vocab
    eos = min(vocab.eos_token_ids)
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    closing = _closers(vocab)
    for _ in range(walks):
        matcher, out = grammar.matcher(), b""
        for step in range(100):
            matcher.fill_bitmask(row)
            allowed = _allowed(row, vocab.size)
            assert allowed.any(), f"dead end after {out!r}"
            if allowed[eos] and (allowed.sum() == 1 or rng.random() < 0.5):
                break
            allowed[eos] = False
            if step > 40 and (allowed & closing).any():
                allowed &= closing
            choices = np.flatnonzero(allowed)
            token = int(choices[rng.randrange(len(choices))])
            assert matcher.accept_token(token)
            out += vocab.token_bytes[token]
        else:
            continue
        value = json.loads(out.decode("utf-8"))
        assert judge.is_valid(value), f"the masks wrote {out!r}, which is invalid"


def _allowed(row: torch.Tensor, size: int) -> np.ndarray:
    """A bitmask row as one bool per token (bit t % 32 of word t // 32, little-endian)."""
    return np.unpackbits(row.numpy().view(np.uint8), bitorder="little")[:size].astype(bool)


@functools.cache
def _closers(vocab) -> np.ndarray:
    """Tokens that end a string, an array or an object (walks take them once long)."""
    return np.array([bool(b and set(b) & set(b'"]}')) for b in vocab.token_bytes])


@pytest.mark.parametrize("keyword", ANNOTATIONS)
def test_annotations_constrain_nothing(keyword, vocab, feeds):
    schema = {keyword: "x" if keyword != "deprecated" else True}
    if keyword in ("$dynamicAnchor", "$recursiveAnchor"):
        schema = {keyword: "x" if keyword == "$dynamicAnchor" else True, "type": "integer"}
        assert feeds(grammars.compile(grammars.JsonSchema.of(schema), vocab), "12")
        return
    grammar = grammars.compile(grammars.JsonSchema.of(schema), vocab)
    for text in ("1", '"a"', "null", '{"a":[true]}'):
        assert feeds(grammar, text), text


REFUSED_IDS = [(k, i) for k, schemas in REFUSED.items() for i in range(len(schemas))]


@pytest.mark.parametrize(("keyword", "i"), REFUSED_IDS, ids=[f"{k}-{i}" for k, i in REFUSED_IDS])
def test_refused_by_name(keyword, i, vocab):
    schema = REFUSED[keyword][i]
    with pytest.raises(ValueError, match=re.escape(keyword)) as refusal:
        grammars.compile(grammars.JsonSchema.of(schema), vocab)
    assert " at #" in str(refusal.value) or "'$ref'" in str(refusal.value), "no path"


def test_every_keyword_is_covered_and_documented():
    covered = set(CASES) | set(ANNOTATIONS)
    assert KEYWORDS - covered == set(), "keywords without a case"
    table = DOC.read_text()
    documented = set(re.findall(r"^\| `([$\w]+)` \|", table, re.MULTILINE))
    assert KEYWORDS - documented == set(), "keywords missing from docs/json-schema.md"
