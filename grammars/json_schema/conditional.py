"""Conditions rewritten as alternatives: property dependencies (draft 4-7 `dependencies`,
dependentRequired, dependentSchemas) and if/then/else."""

from __future__ import annotations

from typing import Any

from braid.grammars.json_schema.errors import InvalidSchema, UnsupportedSchema
from braid.grammars.json_schema.keywords import CONDITIONAL, DEPENDENCIES
from braid.grammars.json_schema.negation import negated_condition

MAX_DEPENDENCIES = 4  # each one doubles the alternatives


def without_dependencies(schema: dict, path: str) -> dict:
    """Property dependencies as alternatives: for each one, either its property is
    absent, or it is present with what it requires (more names, or a schema). A rule
    whose property is required applies always, one whose property is forbidden or whose
    names are required anyway never: neither costs alternatives."""
    base = {k: v for k, v in schema.items() if k not in DEPENDENCIES}
    required = base.get("required", [])
    required = set(required) if isinstance(required, list) else set()
    listed = base.get("properties", {})
    forbidden = (
        {n for n, sub in listed.items() if sub is False} if isinstance(listed, dict) else set()
    )
    rules: list[tuple[str, dict]] = []
    for key in DEPENDENCIES:
        table = schema.get(key, {})
        if not isinstance(table, dict):
            raise InvalidSchema(f"'{key}' must be an object at {path}")
        for name, need in table.items():
            if name in forbidden:
                continue
            if isinstance(need, list):
                if set(need) - required:
                    rules.append((name, {"required": [name, *need]}))
            elif need is not True and need != {}:
                rules.append((name, {"allOf": [{"required": [name]}, need]}))
    always = [present for name, present in rules if name in required]
    if always:
        base = {"allOf": [base, *always]}
    rules = [(name, present) for name, present in rules if name not in required]
    if len(rules) > MAX_DEPENDENCIES:
        raise UnsupportedSchema(
            f"{'/'.join(k for k in DEPENDENCIES if k in schema)!r} at {path}: {len(rules)} "
            f"property dependencies (at most {MAX_DEPENDENCIES})"
        )
    if not rules:
        return base
    variants = [base]
    for name, present in rules:
        absent = {"properties": {name: False}}
        variants = [{"allOf": [v, extra]} for v in variants for extra in (absent, present)]
    return {"anyOf": variants}


def unconditional(conv: Any, schema: dict, path: str) -> dict:
    """if/then/else as (if and then) or (not-if and else): exact where the condition's
    negation is a schema (negation.negated_condition). `conv` is the converter."""
    condition = conv.deref(schema["if"])
    negation = negated_condition(condition)
    if negation is None:
        raise UnsupportedSchema(
            f"keyword 'if' at {path} (supported: conditions on an object's required "
            "properties and on its properties' types and values)"
        )
    rest = {k: v for k, v in schema.items() if k not in CONDITIONAL}
    then, other = schema.get("then", True), schema.get("else", True)
    cases = [{"allOf": [condition, then]}, {"allOf": [negation, other]}]
    return {"allOf": [rest, {"anyOf": cases}]}
