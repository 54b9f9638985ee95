"""Every keyword of JSON Schema draft-07, 2019-09 and 2020-12, implemented or refused by name.

For each keyword braid implements, schemas of our own (read from the specification's text,
not from MaskBench) with instances that jsonschema judges: every invalid instance must be
refused by the masks, the valid ones listed must get through (braid writes compact JSON
with properties in the schema's order, so these are written that way), and seeded random
walks over the masks must write documents jsonschema accepts; those cases are in
test_keyword_applicators.py and test_keyword_validation.py. Here: annotations constrain
nothing, every keyword braid refuses is refused with an error that names it, and
docs/json-schema.md has the table; a keyword missing from it or from the cases fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from keyword_cases import D2019, D2020
from test_keyword_applicators import APPLICATOR_CASES
from test_keyword_validation import VALIDATION_CASES

from braid import grammars

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
    covered = set(APPLICATOR_CASES) | set(VALIDATION_CASES) | set(ANNOTATIONS)
    assert KEYWORDS - covered == set(), "keywords without a case"
    table = DOC.read_text()
    documented = set(re.findall(r"^\| `([$\w]+)` \|", table, re.MULTILINE))
    assert KEYWORDS - documented == set(), "keywords missing from docs/json-schema.md"
