"""allOf: the parts (nested allOf and $refs flattened) merged into one schema, keyword by
keyword; exact for the keywords merged here, refused for two of any other."""

from __future__ import annotations

from typing import Any

from braid.grammars.json_schema.arrays import merged_items
from braid.grammars.json_schema.conditional import unconditional
from braid.grammars.json_schema.errors import InvalidSchema, UnsupportedSchema
from braid.grammars.json_schema.keywords import CONSTRAINING, ITEMS, KEYED, UNEVALUATED
from braid.grammars.json_schema.objects import name_matches
from braid.grammars.json_schema.unevaluated import without_unevaluated
from braid.grammars.json_schema.values import json_equal


def all_of_regex(conv: Any, schema: dict, path: str, depth: int) -> str | None:
    """All parts merged into one schema, converted (`conv` is the converter)."""
    parts: list[dict] = []
    deeper = _collect_parts(conv, schema, path, depth, parts)
    if deeper is None:
        return None
    merged: dict[str, Any] = {}
    checks: list[dict] = []  # conflicting enum/const: kept as checks on the values
    tuples = sum(bool(p.keys() & {"items", "prefixItems"}) for p in parts) > 1
    if tuples:  # item schemas merged position by position
        merged.update(merged_items(parts))
    for part in parts:
        for key, value in part.items():
            if key not in CONSTRAINING or (tuples and key in ITEMS):
                continue
            if key not in merged:
                merged[key] = dict(value) if key in KEYED else value
            elif key in KEYED:
                for name, sub in value.items():
                    old = merged[key].get(name)
                    merged[key][name] = sub if old is None else {"allOf": [old, sub]}
            elif key == "required":
                merged[key] = list(dict.fromkeys([*merged[key], *value]))
            elif key == "type":
                merged[key] = _intersect_types(merged[key], value)
                if not merged[key]:
                    return None
            elif key in ("minimum", "minLength", "minItems", "minProperties"):
                merged[key] = max(merged[key], value)
            elif key in ("maximum", "maxLength", "maxItems", "maxProperties"):
                merged[key] = min(merged[key], value)
            elif key == "not":
                merged[key] = {"anyOf": [merged[key], value]}
            elif key == "propertyNames":
                merged[key] = {"allOf": [merged[key], value]}
            elif key == "uniqueItems":
                merged[key] = merged[key] is True or value is True
            elif key == "anyOf" and len(merged[key]) * len(value) <= 64:
                merged[key] = [{"allOf": [x, y]} for x in merged[key] for y in value]
            elif key in ("enum", "const"):
                checks.append({key: value})
            elif key == "additionalProperties" and not any("patternProperties" in p for p in parts):
                # Properties no part lists obey both (_close_properties handles the
                # properties one part lists and another does not).
                merged[key] = _both_extras(merged[key], value)
            elif not json_equal(merged[key], value):
                raise UnsupportedSchema(f"'allOf' at {path} combines two {key!r} keywords")
    if checks:
        merged["allOf"] = checks
    if not _close_properties(parts, merged, path):
        return None
    return conv.convert(merged, path, deeper)


def _collect_parts(conv: Any, schema: Any, path: str, depth: int, parts: list[dict]) -> int | None:
    """Flatten nested allOf and $refs into `parts`; the depth reached (None: no value)."""
    if schema is True:
        return depth
    if schema is False:
        return None
    if not isinstance(schema, dict):
        raise InvalidSchema(f"'allOf' entries must be schemas at {path}")
    if schema.keys() & UNEVALUATED:
        schema = without_unevaluated(schema, conv.resolver(path))
    if "if" in schema and not schema.keys() & {"then", "else"}:
        schema = {k: v for k, v in schema.items() if k != "if"}
    if "if" in schema:
        schema = unconditional(conv, schema, path)
    deepest = depth
    if "$ref" in schema:
        deeper = conv.follow(schema["$ref"], depth)
        if deeper is None:
            return None
        target = conv.resolve(schema["$ref"], path)
        deepest = _collect_parts(conv, target, path, deeper, parts)
        if deepest is None:
            return None
    subs = schema.get("allOf", [])
    if not isinstance(subs, list) or ("allOf" in schema and not subs):
        raise InvalidSchema(f"'allOf' must be a non-empty list at {path}")
    parts.append({k: v for k, v in schema.items() if k not in ("allOf", "$ref")})
    for sub in subs:
        reached = _collect_parts(conv, sub, path, depth, parts)
        if reached is None:
            return None
        deepest = max(deepest, reached)
    return deepest


def _close_properties(parts: list[dict], merged: dict, path: str) -> bool:
    """additionalProperties in one part forbids the other parts' extra properties: drop
    them (False if one of them is required)."""
    for part in parts:
        extra = part.get("additionalProperties", True)
        if extra is True or extra == {}:
            continue
        if extra is not False:
            if set(merged.get("properties", {})) - set(part.get("properties", {})):
                raise UnsupportedSchema(
                    f"'allOf' at {path}: additionalProperties (or unevaluatedProperties) "
                    "with a schema meets another part's properties"
                )
            continue
        allowed = set(part.get("properties", {}))
        patterns = part.get("patternProperties", {})
        for name in list(merged.get("properties", {})):
            if name not in allowed and not any(name_matches(p, name, path) for p in patterns):
                if name in merged.get("required", []):
                    return False
                del merged["properties"][name]
        merged["additionalProperties"] = False
    return True


def _both_extras(a: Any, b: Any) -> Any:
    """One additionalProperties that means both."""
    if a is False or b is False:
        return False
    if a is True or a == {}:
        return b
    if b is True or b == {}:
        return a
    return {"allOf": [a, b]}


def _intersect_types(a: Any, b: Any) -> list[str]:
    a = [a] if isinstance(a, str) else list(a)
    b = [b] if isinstance(b, str) else list(b)
    out = [t for t in a if t in b]
    integers = ("integer" in a and "number" in b) or ("number" in a and "integer" in b)
    if integers and "integer" not in out:
        out.append("integer")
    return out
