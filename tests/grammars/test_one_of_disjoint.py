"""oneOf branches proved disjoint from ranges, lengths and patterns, and the pairs that must
stay refused because some value matches both (named in the comments, checked by jsonschema).
The corpus (one_of_disjoint.json) checks the accepted ones end to end."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from braid.grammars.json_schema.convert import UnsupportedSchema, schema_to_regex


def one_of(a: dict, b: dict) -> dict:
    return {"oneOf": [a, b]}


DRAFT7 = jsonschema.Draft7Validator


@pytest.mark.parametrize(
    "schema, witnesses, validator",
    [
        (
            one_of({"type": "number", "exclusiveMaximum": 10}, {"type": "number", "minimum": 10}),
            [9.5, 10],
            DRAFT7,
        ),
        (
            one_of({"type": "integer", "maximum": 3, "exclusiveMaximum": True}, {"minimum": 3}),
            [2, 3],
            jsonschema.Draft4Validator,
        ),
        (
            one_of({"type": "string", "maxLength": 2}, {"type": "string", "minLength": 3}),
            ["ab", "abc"],
            DRAFT7,
        ),
        (
            one_of({"type": "string", "pattern": "^[0-9]+$"}, {"type": "string", "pattern": "x"}),
            ["123", "axb"],
            DRAFT7,
        ),
        (
            one_of({"type": "array", "maxItems": 1}, {"type": "array", "minItems": 2}),
            [[1], [1, 2]],
            DRAFT7,
        ),
    ],
    ids=["number-ranges", "draft4-exclusive", "string-lengths", "anchored-vs-unanchored", "items"],
)
def test_disjoint_branches_compile(schema, witnesses, validator):
    """Not refused (schema_to_regex raises UnsupportedSchema when it cannot prove the
    branches disjoint), and the regex writes a value of each branch: neither was dropped."""
    regex = schema_to_regex(schema)
    for branch, value in zip(schema["oneOf"], witnesses, strict=True):
        # The witness belongs to its branch alone.
        assert [validator(b).is_valid(value) for b in schema["oneOf"]].count(True) == 1
        assert validator(branch).is_valid(value)
        assert re.fullmatch(regex, json.dumps(value, ensure_ascii=False, separators=(",", ":")))


@pytest.mark.parametrize(
    "schema, both",
    [
        # The bounds touch: 10 is in both.
        (one_of({"maximum": 10}, {"type": "number", "minimum": 10}), 10),
        # An anchor on one side only: "ab" starts with a and ends with b.
        (one_of({"type": "string", "pattern": "^a"}, {"type": "string", "pattern": "b$"}), "ab"),
        # ^a|b$ is (^a)|(b$), not ^(a|b)$: "cb" matches it and ^cb$.
        (
            one_of({"type": "string", "pattern": "^a|b$"}, {"type": "string", "pattern": "^cb$"}),
            "cb",
        ),
        # ECMA's \s holds the no-break space; Python-dialect tools may read it as ASCII only.
        (
            one_of(
                {"type": "string", "pattern": "^\\s$"}, {"type": "string", "pattern": "^\u00a0$"}
            ),
            "\u00a0",
        ),
        # Items of distinct types, but [] has no items to tell them apart.
        (
            one_of(
                {"type": "array", "items": {"type": "string"}, "minItems": 0},
                {"items": {"type": "number"}},
            ),
            [],
        ),
    ],
    ids=["touching-bounds", "one-sided-anchors", "top-level-bar", "unicode-space", "empty-array"],
)
def test_overlapping_branches_are_refused_or_narrowed(schema, both):
    assert not jsonschema.Draft7Validator(schema).is_valid(both)  # it matches both branches
    try:
        regex = schema_to_regex(schema)
    except UnsupportedSchema:
        return
    # Compiled (a branch narrowed): the value that matches both is not written.
    assert not re.fullmatch(regex, json.dumps(both, ensure_ascii=False, separators=(",", ":")))
