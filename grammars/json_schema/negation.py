"""`not` beyond types, and the negated conditions that `if` needs.

`not` of required properties: `{"not": {"required": ["a", "b"]}}` (a and b never together),
its allOf (the same, names pooled) and anyOf (each alternative negated: neither). A regex
cannot say "not both", so generation forbids one name of each such set outright
(properties: false), which is stricter and so safe. A name the object requires anyway is
never the one chosen when another will do.

`not` of values: `{"not": {"enum": [...]}}` (or const, beside a type, or an anyOf of such
and of types): the converter writes each type without those values.

`if`/`then`/`else` becomes (if and then) or (not-if and else), for conditions whose
negation is a schema again: an object's required names and its properties' types and
values.
"""

from __future__ import annotations

from typing import Any

from braid.grammars.json_schema.values import is_type

# Keys a negated `required` may carry without changing what it says about objects.
_BESIDE_REQUIRED = {"type", "title", "description", "$comment"}


def required_clauses(excluded: Any) -> list[list[str]] | None:
    """The sets of names of which no valid object holds all, when `excluded` (the value of
    `not`) only requires properties; None for any other `not`."""
    if not isinstance(excluded, dict):
        return None
    keys = set(excluded) - _BESIDE_REQUIRED
    if excluded.get("type", "object") != "object":
        return None
    if keys == {"required"} and _names(excluded["required"]):
        return [list(excluded["required"])]
    if keys == {"allOf"} and isinstance(excluded["allOf"], list):
        parts = [required_clauses(p) for p in excluded["allOf"]]
        if parts and all(p is not None and len(p) == 1 for p in parts):
            return [list(dict.fromkeys(name for p in parts for name in p[0]))]
    if keys == {"anyOf"} and isinstance(excluded["anyOf"], list):
        parts = [required_clauses(p) for p in excluded["anyOf"]]
        if parts and all(p is not None for p in parts):
            return [clause for p in parts for clause in p]
    return None


def forbidden_names(clauses: list[list[str]], required: Any) -> list[str]:
    """One name of each clause, preferring names already chosen and names not required."""
    required = set(required) if isinstance(required, list) else set()
    chosen: list[str] = []
    for clause in clauses:
        if any(name in chosen for name in clause):
            continue
        free = [name for name in clause if name not in required]
        chosen.append((free or clause)[0])
    return chosen


def _names(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(n, str) for n in value)


def excluded_values(excluded: Any) -> tuple[list, list[str]] | None:
    """The values and the whole types that `excluded` (the value of `not`) names, when it
    names at least one value: const or enum (beside a type that filters them), or an anyOf
    of those and of plain types; None for any other `not`."""
    if not isinstance(excluded, dict):
        return None
    keys = set(excluded) - _ANNOTATIONS
    if keys == {"anyOf"} and isinstance(excluded["anyOf"], list) and excluded["anyOf"]:
        values: list = []
        types: list[str] = []
        for part in excluded["anyOf"]:
            if isinstance(part, dict) and set(part) - _ANNOTATIONS == {"type"}:
                types += _types(part["type"]) or []
            elif (named := excluded_values(part)) is not None:
                values += named[0]
                types += named[1]
            else:
                return None
        return (values, types) if values else None
    if len(keys & {"const", "enum"}) != 1 or keys - {"const", "enum", "type"}:
        return None
    values = [excluded["const"]] if "const" in excluded else excluded["enum"]
    types = _types(excluded.get("type", list(_ALL_TYPES)))
    if not isinstance(values, list) or types is None:
        return None
    values = [v for v in values if any(is_type(v, t) for t in types)]
    return (values, []) if values else None


def negated_condition(condition: Any) -> Any:
    """A schema valid for exactly the objects `condition` (an `if`) refuses, when it only
    asks for required names and for properties' types or values (`excluded_values`); None
    for any other condition. Non-objects are left to the `then` side (they pass a condition
    on properties), which generation narrows to objects anyway: stricter, safe."""
    if isinstance(condition, bool):
        return not condition
    if not isinstance(condition, dict) or condition.get("type", "object") != "object":
        return None
    if set(condition) - _BESIDE_REQUIRED - {"properties", "required"}:
        return None
    properties, required = condition.get("properties", {}), condition.get("required", [])
    if not isinstance(properties, dict) or not (required == [] or _names(required)):
        return None
    options: list[dict] = []
    for name, sub in properties.items():
        if sub is False:
            options.append({"required": [name]})
        elif sub is not True and sub != {}:
            if not _typed_or_valued(sub):
                return None
            options.append({"required": [name], "properties": {name: {"not": sub}}})
    options += [{"properties": {name: False}} for name in required]
    return {"type": "object", "anyOf": options} if options else False


_ANNOTATIONS = {"title", "description", "$comment"}
_ALL_TYPES = ("string", "integer", "number", "object", "array", "boolean", "null")


def _typed_or_valued(schema: Any) -> bool:
    """Whether `not` of `schema` is one the converter writes: of types, or of values."""
    if not isinstance(schema, dict):
        return False
    keys = set(schema) - _ANNOTATIONS
    if keys == {"type"}:
        return _types(schema["type"]) is not None
    if keys == {"anyOf"} and isinstance(schema["anyOf"], list):
        return all(_typed_or_valued(part) for part in schema["anyOf"])
    return excluded_values(schema) is not None


def _types(declared: Any) -> list[str] | None:
    types = [declared] if isinstance(declared, str) else declared
    if not isinstance(types, list) or not all(t in _ALL_TYPES for t in types):
        return None
    return types
