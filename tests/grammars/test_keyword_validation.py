"""The keywords of the validation, format and content vocabularies braid implements (type,
enum, const, numeric and length bounds, pattern, item and property counts, required,
format, contentSchema): each case's invalid instances refused by the masks, its valid ones
admitted, random walks over the masks valid (keyword_cases.check_case).
test_keyword_soundness.py checks that every keyword has cases."""

from __future__ import annotations

import pytest
from keyword_cases import case_ids, check_case

# keyword -> [(schema, instances that must get through, instances that must be refused)]
VALIDATION_CASES: dict[str, list[tuple]] = {
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
CASE_IDS = case_ids(VALIDATION_CASES)


@pytest.mark.parametrize(("keyword", "i"), CASE_IDS, ids=[f"{k}-{i}" for k, i in CASE_IDS])
def test_invalid_refused_valid_admitted(keyword, i, vocab, feeds):
    check_case(VALIDATION_CASES[keyword][i], f"{keyword}-{i}", vocab, feeds)
