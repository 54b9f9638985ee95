"""The keyword vocabulary: which keywords annotate, which constrain one type, which combine;
and the check every min/max keyword pair shares."""

from __future__ import annotations

from typing import Any

from braid.grammars.json_schema.errors import InvalidSchema, UnsupportedSchema

# Keywords that describe and never constrain (identifiers and anchors are read when
# references are, refs.py; `nullable` is OpenAPI's, which JSON Schema validators ignore:
# null is written only where `type` allows it).
ANNOTATIONS = {
    "$schema", "$id", "id", "$comment", "title", "description", "default", "examples",
    "example", "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding",
    "contentSchema", "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$vocabulary", "$defs",
    "definitions", "discriminator", "xml", "externalDocs", "nullable",
}  # fmt: skip
# Keywords of one type (they say nothing about values of other types); the array ones are
# arrays.py's. unevaluatedProperties and unevaluatedItems are rewritten before
# (unevaluated.py).
TYPE_KEYWORDS = {
    "string": {"minLength", "maxLength", "pattern", "format"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "object": {
        "properties", "required", "additionalProperties", "minProperties", "maxProperties",
        "patternProperties", "propertyNames",
    },
    "array": {"items", "prefixItems", "minItems", "maxItems", "additionalItems", "uniqueItems",
              "contains", "minContains", "maxContains"},
    "boolean": set(),
    "null": set(),
}  # fmt: skip
GENERAL = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "not"}
UNEVALUATED = frozenset({"unevaluatedProperties", "unevaluatedItems"})
ALL_TYPES = tuple(TYPE_KEYWORDS)
TYPED = set().union(*TYPE_KEYWORDS.values())
# Draft 4-7 `dependencies` (both forms) and their 2019-09 names: expanded into anyOf.
DEPENDENCIES = ("dependencies", "dependentRequired", "dependentSchemas")
CONDITIONAL = ("if", "then", "else")
CONSTRAINING = GENERAL | TYPED | set(DEPENDENCIES) | {"if"}
KEYED = ("properties", "patternProperties")  # name -> schema maps, merged by name
ITEMS = ("items", "prefixItems", "additionalItems")  # merged by arrays.merged_items


def check_bound(lo: Any, hi: Any, lo_name: str, hi_name: str, path: str) -> None:
    """A min/max keyword pair (minLength/maxLength, minItems/maxItems): non-negative integers,
    the lower bound not above the upper one."""
    if (
        not isinstance(lo, int)
        or lo < 0
        or (hi is not None and (not isinstance(hi, int) or hi < 0))
    ):
        raise InvalidSchema(f"'{lo_name}'/'{hi_name}' must be non-negative integers at {path}")
    if hi is not None and lo > hi:
        raise UnsupportedSchema(f"'{lo_name}' {lo} > '{hi_name}' {hi} at {path}: unsatisfiable")
