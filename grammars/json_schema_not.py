"""`not` of required properties: `{"not": {"required": ["a", "b"]}}` (a and b never together),
its allOf (the same, names pooled) and anyOf (each alternative negated: neither).

A regex cannot say "not both", so generation forbids one name of each such set outright
(properties: false), which is stricter and so safe. A name the object requires anyway is
never the one chosen when another will do.
"""

from __future__ import annotations

from typing import Any

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
