"""oneOf without a regex for "exactly one": prove the branches never overlap, or make them.

A regex can only say "any of these". So a oneOf is generated as the anyOf of its branches
once we have proved, pair by pair, that whatever one branch generates is invalid under the
other. The proof works from cheap facts: types, constants, required and forbidden
properties, closed objects, and for a finite branch its values checked one by one.

When the proof fails for a pair, the generating branch may be narrowed, which is stricter
and so still safe (the values it drops would have matched both branches, or are a small
price for an exact constraint):
- a property both branches pin to constants that never meet becomes required;
- a property the other branch requires is forbidden;
- against a closed branch, a property it does not list becomes required.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

from grammars.json_schema_not import forbidden_names, required_clauses
from grammars.json_schema_values import is_valid, json_equal
from grammars.schema_errors import UnsupportedSchema

_COMBINATORS = {"allOf", "anyOf", "oneOf", "$ref"}
ANY_TYPE = frozenset({"null", "boolean", "object", "array", "number", "string"})


@dataclass(frozen=True)
class Facts:
    """What a branch says: as generated (with the oneOf's siblings folded in, types inferred
    from keywords) or as judged (the branch alone, as a validator reads it)."""

    schema: Any  # the branch alone, for checking a finite set of values against it
    types: frozenset[str]  # integer counted as number
    values: list | None  # the branch is this enum/const
    props: dict[str, Any]  # property name -> schema (False: forbidden)
    required: frozenset[str]
    open: bool  # names not in `props` are allowed
    listed_only: bool  # generated objects hold only names in `props` or `required`
    narrowing: dict = field(default_factory=dict)  # a schema to add with allOf, or {}


def exclusive_branches(subs: list, rest: dict, conv: Any, path: str, depth: int) -> list:
    """The oneOf's branches, some narrowed, such that each generates only values that
    no other branch accepts; UnsupportedSchema naming the pair when that cannot be shown.
    `conv` is the converter: its deref, resolve and declared_types read the schema, and
    its convert gives a branch's regex (to check it against another branch's values)."""

    def resolve(ref: str) -> Any:
        return conv.resolve(ref, path)

    def regex(gen: Facts) -> str | None:
        branch = {"allOf": [gen.schema, gen.narrowing]} if gen.narrowing else gen.schema
        return conv.convert({"allOf": [rest, branch]} if rest else branch, path, depth)

    owns = [_facts(sub, None, conv, path) for sub in subs]
    gens = [_facts(sub, rest, conv, path) for sub in subs]
    out = []
    for i, gen in enumerate(gens):
        for j, own in enumerate(owns):
            if i == j or _excludes(gen, own, resolve, regex):
                continue
            narrowed = _separate(gen, own)
            if narrowed is None or not _excludes(narrowed, own, resolve, regex):
                raise UnsupportedSchema(
                    f"'oneOf' at {path}: branches {min(i, j)} and {max(i, j)} may both match "
                    "one value (supported: branches of distinct types or values, told apart "
                    "by a property's constants, by a property one requires and the other "
                    "need not have, or by a closed branch)"
                )
            gen = narrowed
        out.append({"allOf": [subs[i], gen.narrowing]} if gen.narrowing else subs[i])
    return out


def _facts(sub: Any, rest: dict | None, conv: Any, path: str) -> Facts:
    """Facts of a branch as judged (rest None) or as generated (rest: the siblings)."""
    sub = conv.deref(sub)
    if not isinstance(sub, dict) or "$ref" in sub:
        return Facts(sub, ANY_TYPE, None, {}, frozenset(), True, False)
    original = sub
    folded = _merge_parts(sub, conv, 3) if isinstance(sub.get("allOf"), list) else None
    sub = folded or sub
    merged = {**(rest or {}), **sub}
    negated = required_clauses(sub["not"]) if "not" in sub else None
    values = None
    if "const" in merged or "enum" in merged:
        values = [merged["const"]] if "const" in merged else list(merged["enum"])
    if values is not None:
        types = {_json_type(v) for v in values}
    elif "type" not in merged and ("allOf" in sub or ("not" in sub and negated is None)):
        types = ANY_TYPE
    elif "type" not in merged and ("anyOf" in sub or "oneOf" in sub):
        # What the branches accept (as judged: a superset of what they generate).
        branches = sub.get("anyOf", sub.get("oneOf"))
        if not isinstance(branches, list):
            return Facts(sub, ANY_TYPE, None, {}, frozenset(), True, False)
        types = set().union(*(_facts(b, None, conv, path).types for b in branches))
    elif rest is None and "type" not in sub:
        types = ANY_TYPE  # a validator does not infer types from keywords
    else:
        types = set(conv.declared_types(merged if rest is not None else sub, path))
    props = {}
    listed = [s.get("properties") for s in (rest or {}, sub)]
    for name, prop in {k: v for d in listed if isinstance(d, dict) for k, v in d.items()}.items():
        props[name] = conv.deref(prop)
    required = set(sub.get("required", []))
    if rest is not None:
        required |= set(rest.get("required", []))
    if negated is not None:
        # Judged: a name the `not` requires alone is invalid. Generated: the names the
        # converter forbids (the same choice, unless the siblings add a `not` of their own).
        if rest is None:
            gone = [clause[0] for clause in negated if len(clause) == 1]
        else:
            gone = [] if "not" in rest else forbidden_names(negated, list(required))
        props.update({name: False for name in gone})
    source = merged if rest is not None else sub
    closed = source.get("additionalProperties", True) is False and not source.get(
        "patternProperties"
    )
    return Facts(
        original,
        frozenset(_as_numbers(types)),
        values,
        props,
        frozenset(required),
        not closed,
        # Parts merged in from elsewhere may list more names than we see here.
        listed_only=bool(props or required)
        and folded is None
        and not merged.keys() & _COMBINATORS
        and conv.extras(merged) is None,
    )


def _merge_parts(schema: dict, conv: Any, depth: int) -> dict | None:
    """An allOf's parts folded into one schema for the facts above: required names pooled,
    properties listed by any part (a part's constants kept: every value must be among
    them), closed if any part is, types narrowed to those every typing part allows, a
    part's enum/const. None when a part holds a combinator or an unresolved $ref (what it
    generates is not read here)."""
    out = {k: v for k, v in schema.items() if k != "allOf"}
    for part in schema["allOf"]:
        part = conv.deref(part)
        if isinstance(part, dict) and isinstance(part.get("allOf"), list) and depth > 0:
            part = _merge_parts(part, conv, depth - 1)
        if not isinstance(part, dict) or part.keys() & _COMBINATORS or "not" in part:
            return None
        for name, prop in (part.get("properties") or {}).items():
            known = out.setdefault("properties", {}).get(name)
            if known is None or (_constants(prop) is not None and _constants(known) is None):
                out["properties"] = {**out["properties"], name: prop}
        if isinstance(part.get("required"), list):
            out["required"] = list(dict.fromkeys([*out.get("required", []), *part["required"]]))
        if part.get("additionalProperties") is False and not part.get("patternProperties"):
            out["additionalProperties"] = False
        if "type" in part:
            theirs = part["type"] if isinstance(part["type"], list) else [part["type"]]
            ours = out.get("type", theirs)
            ours = ours if isinstance(ours, list) else [ours]
            out["type"] = [
                t for t in ours if t in theirs or (t == "integer" and "number" in theirs)
            ]
        for key in ("const", "enum"):
            if key in part and key not in out:
                out[key] = part[key]
    return out


def _excludes(gen: Facts, other: Facts, resolve, regex) -> bool:
    """True when no value generated under `gen` is valid under `other`."""
    if not gen.types & other.types:
        return True
    if gen.values is not None:
        try:
            return not any(is_valid(v, other.schema, resolve) for v in gen.values)
        except UnsupportedSchema:
            return False
    if other.values is not None and all(_spelled_once(v) for v in other.values):
        # `other` is a finite set: none of its values is text that `gen` writes.
        written = regex(gen)
        return written is None or not any(
            re.fullmatch(written, json.dumps(v, ensure_ascii=False)) for v in other.values
        )
    if gen.types != {"object"}:
        return False
    for name in gen.required:
        theirs = other.props.get(name)
        if theirs is False or (not other.open and name not in other.props):
            return True
        if _apart(gen.props.get(name), theirs):
            return True
    for name in other.required:
        if gen.props.get(name) is False:
            return True
        if gen.listed_only and name not in gen.props and name not in gen.required:
            return True
    return False


def _separate(gen: Facts, other: Facts) -> Facts | None:
    """`gen` narrowed so that `other` rejects what it generates, or None."""
    if gen.types != {"object"}:
        return None
    writable = [n for n, p in gen.props.items() if p is not False]
    for name in writable:
        if _apart(gen.props[name], other.props.get(name)):
            return _require(gen, name)
    for name in other.required:
        if name not in gen.required:
            return _forbid(gen, name)
    if not other.open:
        for name in writable:
            if name not in other.props:
                return _require(gen, name)
    return None


def _require(gen: Facts, name: str) -> Facts:
    narrowing = dict(gen.narrowing)
    narrowing["required"] = [*narrowing.get("required", []), name]
    return replace(gen, required=gen.required | {name}, narrowing=narrowing)


def _forbid(gen: Facts, name: str) -> Facts:
    narrowing = dict(gen.narrowing)
    narrowing["properties"] = {**narrowing.get("properties", {}), name: False}
    return replace(gen, props={**gen.props, name: False}, narrowing=narrowing)


def _spelled_once(value: Any) -> bool:
    """Scalars whose text the regex check can look for. Numbers are left out: 1, 1.0 and
    1e0 are one value, and a regex that refuses one spelling may write another."""
    return value is None or isinstance(value, (bool, str))


def _apart(a: Any, b: Any) -> bool:
    """Both schemas are finite sets of values, with no value in common."""
    x, y = _constants(a), _constants(b)
    return x is not None and y is not None and not any(json_equal(u, v) for u in x for v in y)


def _constants(schema: Any) -> list | None:
    if isinstance(schema, dict):
        if "const" in schema:
            return [schema["const"]]
        if isinstance(schema.get("enum"), list):
            return schema["enum"]
    return None


def _as_numbers(types) -> set[str]:
    """Types with integer counted as number (an integer is a number)."""
    return {"number" if t == "integer" else t for t in types}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"
