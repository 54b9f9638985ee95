"""The keywords of the core and applicator vocabularies braid implements (references,
combinators, conditionals, dependencies, array items and object properties, unevaluated*):
each case's invalid instances refused by the masks, its valid ones admitted, random walks
over the masks valid (keyword_cases.check_case). test_keyword_soundness.py checks that every
keyword has cases."""

from __future__ import annotations

import pytest
from keyword_cases import D7, D2019, D2020, case_ids, check_case

POSITIVE = {"type": "integer", "minimum": 1}
NODE = {  # a recursive tree, for the reference keywords
    "type": "object",
    "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "maxItems": 2}},
    "required": ["v"],
    "additionalProperties": False,
}

# keyword -> [(schema, instances that must get through, instances that must be refused)]
APPLICATOR_CASES: dict[str, list[tuple]] = {
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
}
CASE_IDS = case_ids(APPLICATOR_CASES)


@pytest.mark.parametrize(("keyword", "i"), CASE_IDS, ids=[f"{k}-{i}" for k, i in CASE_IDS])
def test_invalid_refused_valid_admitted(keyword, i, vocab, feeds):
    check_case(APPLICATOR_CASES[keyword][i], f"{keyword}-{i}", vocab, feeds)
