"""Is this JSON value valid under this schema? For the converter's finite cases.

An enum or const next to other keywords (`{"enum": [...], "not": {...}}`, `allOf` of an enum
and a type) is a finite set of values: we keep the ones valid under the rest of the schema,
which this checks exactly. A keyword it cannot check raises UnsupportedSchema, so a value
is never kept on a guess. Unknown keywords are annotations, as in the JSON Schema spec.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from braid.grammars.json_schema.errors import UnsupportedSchema
from braid.grammars.json_schema.formats import is_format

_UNCHECKED = {"unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"}


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but true != 1, and containers compare deeply."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def is_type(value: Any, name: str) -> bool:
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool)
    if name == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if name == "string":
        return isinstance(value, str)
    if name == "array":
        return isinstance(value, list)
    if name == "object":
        return isinstance(value, dict)
    raise UnsupportedSchema(f"unknown type {name!r}")


def is_valid(value: Any, schema: Any, resolve: Callable[[str], Any], depth: int = 0) -> bool:
    if schema is True or schema == {}:
        return True
    if schema is False:
        return False
    if not isinstance(schema, dict) or depth > 64:
        raise UnsupportedSchema("cannot check an enum value against this schema")
    if unchecked := schema.keys() & _UNCHECKED:
        raise UnsupportedSchema(f"keyword {sorted(unchecked)[0]!r} next to enum/const")
    checks = (_check_general, _check_number, _check_string, _check_array, _check_object)
    return all(check(value, schema, resolve, depth + 1) for check in checks)


def _check_general(value: Any, s: dict, resolve, depth: int) -> bool:
    if "$ref" in s and not is_valid(value, resolve(s["$ref"]), resolve, depth):
        return False
    if "type" in s:
        types = [s["type"]] if isinstance(s["type"], str) else s["type"]
        if not any(is_type(value, t) for t in types):
            return False
    if "enum" in s and not any(json_equal(value, v) for v in s["enum"]):
        return False
    if "const" in s and not json_equal(value, s["const"]):
        return False
    if "not" in s and is_valid(value, s["not"], resolve, depth):
        return False
    if "allOf" in s and not all(is_valid(value, x, resolve, depth) for x in s["allOf"]):
        return False
    if "anyOf" in s and not any(is_valid(value, x, resolve, depth) for x in s["anyOf"]):
        return False
    if "oneOf" in s and sum(is_valid(value, x, resolve, depth) for x in s["oneOf"]) != 1:
        return False
    if "if" in s:
        holds = is_valid(value, s["if"], resolve, depth)
        if not is_valid(value, s.get("then" if holds else "else", True), resolve, depth):
            return False
    return True


def _check_number(value: Any, s: dict, resolve, depth: int) -> bool:
    if not is_type(value, "number"):
        return True
    lo, hi = s.get("minimum"), s.get("maximum")
    ex_lo, ex_hi = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
    if lo is not None and (value < lo or (ex_lo is True and value == lo)):
        return False
    if hi is not None and (value > hi or (ex_hi is True and value == hi)):
        return False
    if not isinstance(ex_lo, bool) and ex_lo is not None and value <= ex_lo:
        return False
    if not isinstance(ex_hi, bool) and ex_hi is not None and value >= ex_hi:
        return False
    step = s.get("multipleOf")
    if step is not None:
        quotient = value / step
        if not (math.isfinite(quotient) and quotient == int(quotient)):
            return False
    return True


def _check_string(value: Any, s: dict, resolve, depth: int) -> bool:
    if not isinstance(value, str):
        return True
    if len(value) < s.get("minLength", 0):
        return False
    if "maxLength" in s and len(value) > s["maxLength"]:
        return False
    if "pattern" in s:
        try:
            return re.search(s["pattern"], value) is not None
        except re.error:
            raise UnsupportedSchema(f"pattern {s['pattern']!r} next to enum/const") from None
    # An annotation for validators by default; the formats we write are checked (stricter).
    return not isinstance(s.get("format"), str) or is_format(value, s["format"])


def _check_array(value: Any, s: dict, resolve, depth: int) -> bool:
    if not isinstance(value, list):
        return True
    if len(value) < s.get("minItems", 0) or len(value) > s.get("maxItems", math.inf):
        return False
    if s.get("uniqueItems") is True:
        for i, a in enumerate(value):
            if any(json_equal(a, b) for b in value[i + 1 :]):
                return False
    items = s.get("items", True)
    prefix = s.get("prefixItems", [])
    rest = items
    if isinstance(items, list):
        prefix, rest = items, s.get("additionalItems", True)
    for i, item in enumerate(value):
        sub = prefix[i] if i < len(prefix) else rest
        if not is_valid(item, sub, resolve, depth):
            return False
    if "contains" in s:
        matches = sum(is_valid(item, s["contains"], resolve, depth) for item in value)
        least, most = s.get("minContains", 1), s.get("maxContains", math.inf)
        if not least <= matches <= most:
            return False
    return True


def _check_object(value: Any, s: dict, resolve, depth: int) -> bool:
    if not isinstance(value, dict):
        return True
    if any(name not in value for name in s.get("required", [])):
        return False
    if len(value) < s.get("minProperties", 0) or len(value) > s.get("maxProperties", math.inf):
        return False
    props = s.get("properties", {})
    patterns = s.get("patternProperties", {})
    extra = s.get("additionalProperties", True)
    for name, item in value.items():
        matched = [sub for p, sub in patterns.items() if _search(p, name)]
        subs = [props[name]] if name in props else [] if matched else [extra]
        if not all(is_valid(item, sub, resolve, depth) for sub in subs + matched):
            return False
        if not is_valid(name, s.get("propertyNames", True), resolve, depth):
            return False
    for key in ("dependencies", "dependentRequired", "dependentSchemas"):
        table = s.get(key, {})
        if not isinstance(table, dict):
            raise UnsupportedSchema(f"'{key}' must be an object")
        for name, need in table.items():
            if name not in value:
                continue
            if isinstance(need, list):
                if any(n not in value for n in need):
                    return False
            elif not is_valid(value, need, resolve, depth):
                return False
    return True


def _search(pattern: str, text: str) -> bool:
    try:
        return re.search(pattern, text) is not None
    except re.error:
        raise UnsupportedSchema(f"pattern {pattern!r} next to enum/const") from None
