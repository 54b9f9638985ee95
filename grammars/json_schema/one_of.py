"""oneOf without a regex for "exactly one": prove the branches never overlap, or make them.

A regex can only say "any of these". So a oneOf is generated as the anyOf of its branches
once we have proved, pair by pair, that whatever one branch generates is invalid under the
other. The proof works from cheap facts: types, constants, required and forbidden
properties, closed objects, for a finite branch its values checked one by one, and disjoint
number ranges, string or array lengths, or a required property whose schemas are disjoint
(checked the same way, a few levels down).

When the proof fails for a pair, the generating branch may be narrowed, which is stricter
and so still safe (the values it drops would have matched both branches, or are a small
price for an exact constraint):
- a property both branches pin to constants that never meet becomes required;
- a property the other branch requires is forbidden;
- against a closed branch, a property it does not list becomes required;
- arrays whose items are disjoint become non-empty (the empty array matches both).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

import interegular

from braid.grammars.json_schema.errors import UnsupportedSchema
from braid.grammars.json_schema.negation import excluded_values, forbidden_names, required_clauses
from braid.grammars.json_schema.ranges import number_bounds
from braid.grammars.json_schema.values import is_valid

# Keywords whose parts write what the facts below do not read (then/else add properties).
_COMBINATORS = {"allOf", "anyOf", "oneOf", "$ref", "if"}
ANY_TYPE = frozenset({"null", "boolean", "object", "array", "number", "string"})
_DEPTH = 3  # levels of nested properties and items the disjointness proof looks through


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
    # One schema every generated value satisfies (the siblings and the branch merged): read
    # as a validator reads it, a superset of what is generated.
    whole: Any = None


def exclusive_branches(subs: list, rest: dict, conv: Any, path: str, depth: int) -> list:
    """The oneOf's branches, some narrowed, such that each generates only values that
    no other branch accepts; UnsupportedSchema naming the pair when that cannot be shown.
    `conv` is the converter: its deref, resolve and declared_types read the schema, and
    its convert gives a branch's regex (to check it against another branch's values)."""

    def resolve(ref: str) -> Any:
        return conv.resolve(ref, path)

    def apart(a: Any, b: Any) -> bool:
        return a is not None and b is not None and _disjoint(a, b, conv, resolve, _DEPTH)

    def regex(gen: Facts) -> str | None:
        branch = {"allOf": [gen.schema, gen.narrowing]} if gen.narrowing else gen.schema
        return conv.convert({"allOf": [rest, branch]} if rest else branch, path, depth)

    owns = [_facts(sub, None, conv, path) for sub in subs]
    gens = [_facts(sub, rest, conv, path) for sub in subs]
    out = []
    for i, gen in enumerate(gens):
        for j, own in enumerate(owns):
            if i == j or _excludes(gen, own, resolve, regex, apart):
                continue
            narrowed = _separate(gen, own, apart)
            if narrowed is None or not _excludes(narrowed, own, resolve, regex, apart):
                narrowed = _without(gen, own, conv, resolve)
            if narrowed is None:
                raise UnsupportedSchema(
                    f"'oneOf' at {path}: branches {min(i, j)} and {max(i, j)} may both match "
                    "one value (supported: branches of distinct types or values, of disjoint "
                    "ranges, lengths or patterns, told apart by a required property's schemas, "
                    "by a property one requires and the other need not have, or by a closed "
                    "branch, or one whose negation is a schema: types, values, required names)"
                )
            gen = narrowed
        out.append({"allOf": [subs[i], gen.narrowing]} if gen.narrowing else subs[i])
    return out


def _facts(sub: Any, rest: dict | None, conv: Any, path: str) -> Facts:
    """Facts of a branch as judged (rest None) or as generated (rest: the siblings)."""
    sub = conv.deref(sub)
    if not isinstance(sub, dict) or "$ref" in sub:
        return Facts(sub, ANY_TYPE, None, {}, frozenset(), True, False, whole=sub)
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
            return Facts(sub, ANY_TYPE, None, {}, frozenset(), True, False, whole=merged)
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
        whole=merged,
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


def _excludes(gen: Facts, other: Facts, resolve, regex, apart) -> bool:
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
    if gen.types == {"object"}:
        for name in gen.required:
            theirs = other.props.get(name)
            if theirs is False or (not other.open and name not in other.props):
                return True
            if apart(gen.props.get(name), theirs):
                return True
        for name in other.required:
            if gen.props.get(name) is False:
                return True
            if gen.listed_only and name not in gen.props and name not in gen.required:
                return True
    return apart(gen.whole, other.schema)


def _separate(gen: Facts, other: Facts, apart) -> Facts | None:
    """`gen` narrowed so that `other` rejects what it generates, or None."""
    whole = gen.whole if isinstance(gen.whole, dict) else {}
    if gen.types == {"array"} and whole.get("minItems", 0) < 1 and isinstance(other.schema, dict):
        if apart(whole.get("items"), other.schema.get("items")):
            narrowing = {**gen.narrowing, "minItems": 1}
            return replace(gen, narrowing=narrowing, whole={**whole, "minItems": 1})
    if gen.types != {"object"}:
        return None
    writable = [n for n, p in gen.props.items() if p is not False]
    for name in writable:
        if apart(gen.props[name], other.props.get(name)):
            return _require(gen, name)
    for name in sorted(other.required):  # (sorted: the same regex in every process)
        if name not in gen.required:
            return _forbid(gen, name)
    if not other.open:
        for name in writable:
            if name not in other.props:
                return _require(gen, name)
    return None


def _without(gen: Facts, other: Facts, conv: Any, resolve) -> Facts | None:
    """`gen` less every value `other` accepts, where that is a schema: a finite branch keeps
    the values `other` refuses; any branch may take `not` of a branch of types, values or
    required names (which the converter writes exactly, or stricter)."""
    if gen.values is not None:
        try:
            kept = [v for v in gen.values if not is_valid(v, other.schema, resolve)]
        except UnsupportedSchema:
            kept = None
        if kept is not None:
            narrowing = {"enum": kept} if kept else {"not": {}}  # none left: no value
            return replace(gen, values=kept, narrowing=_narrowed(gen.narrowing, narrowing))
    schema = conv.deref(other.schema)
    if not _negatable(schema):
        return None
    return replace(gen, narrowing=_narrowed(gen.narrowing, {"not": schema}))


def _narrowed(narrowing: Any, more: Any) -> Any:
    return more if not narrowing else {"allOf": [narrowing, more]}


def _negatable(schema: Any) -> bool:
    """Whether the converter writes `not` of this schema (json_schema_not)."""
    if not isinstance(schema, dict):
        return False
    if set(schema) - _NEGATION_ANNOTATIONS == {"type"}:
        return True
    return excluded_values(schema) is not None or required_clauses(schema) is not None


_NEGATION_ANNOTATIONS = {"title", "description", "$comment"}


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


def _disjoint(a: Any, b: Any, conv: Any, resolve, depth: int) -> bool:
    """True when no value is valid under both schemas, as a validator reads them. Each is read
    from its own keywords; combinators beside them only remove values, so leaving them out
    keeps the answer safe."""
    a, b = conv.deref(a), conv.deref(b)
    if a is False or b is False:
        return True
    if not (isinstance(a, dict) and isinstance(b, dict)) or "$ref" in a or "$ref" in b:
        return False
    for x, y in ((a, b), (b, a)):
        values = _constants(x)
        if values is not None:
            try:
                return not any(is_valid(v, y, resolve) for v in values)
            except UnsupportedSchema:
                return False
    common = _judged_types(a) & _judged_types(b)
    if not common:
        return True
    if len(common) > 1 or depth == 0:
        return False
    kind = next(iter(common))
    if kind == "number":
        return _bounds_apart(number_bounds(a), number_bounds(b))
    if kind == "string":
        if _bounds_apart(_length_bounds(a, "Length"), _length_bounds(b, "Length")):
            return True
        return _strings_apart(a, b, resolve)
    if kind == "array":
        if _bounds_apart(_length_bounds(a, "Items"), _length_bounds(b, "Items")):
            return True
        # Only the empty array can match both.
        items_a, items_b = a.get("items"), b.get("items")
        return (
            max(a.get("minItems", 0), b.get("minItems", 0)) >= 1
            and isinstance(items_a, dict)
            and isinstance(items_b, dict)
            and _disjoint(items_a, items_b, conv, resolve, depth - 1)
        )
    if kind == "object":
        for x, y in ((a, b), (b, a)):
            props_x, props_y = x.get("properties") or {}, y.get("properties") or {}
            closed = y.get("additionalProperties") is False and not y.get("patternProperties")
            for name in x.get("required") or []:
                if name not in props_y:
                    if closed:
                        return True
                    continue
                if _disjoint(props_x.get(name, True), props_y[name], conv, resolve, depth - 1):
                    return True
    return False


def _strings_apart(a: dict, b: dict, resolve) -> bool:
    """Disjoint string schemas: one admits only "" and the other refuses it, or their
    patterns match no string in common."""
    for x, y in ((a, b), (b, a)):
        if x.get("maxLength") == 0:
            try:
                return not is_valid("", y, resolve)
            except UnsupportedSchema:
                return False
    pa, pb = a.get("pattern"), b.get("pattern")
    if not (isinstance(pa, str) and isinstance(pb, str)):
        return False
    fa, fb = _pattern_fsm(pa), _pattern_fsm(pb)
    # (not FSM.isdisjoint: over two alphabets it answered True for a[\s\S]* and [\s\S]*b)
    return fa is not None and fb is not None and (fa & fb).empty()


# Pattern syntax whose meaning interegular (Python's regex dialect) may read narrower than
# ECMA-262 does, which would make a "disjoint" answer wrong: \s and \W (Unicode spaces),
# word boundaries, and escapes of code points, control characters and properties.
_UNSAFE_ESCAPES = re.compile(r"\\[sWbBuxcpPk]")
_COUNT = re.compile(r"\{(\d+)(?:,(\d*))?\}")


@functools.lru_cache(maxsize=256)
def _pattern_fsm(pattern: str):
    """An automaton of the strings in which `pattern` matches somewhere (a superset of
    them, or None when that cannot be built safely and cheaply)."""
    if len(pattern) > 200 or _UNSAFE_ESCAPES.search(pattern):
        return None
    if any(int(n) > 32 for m in _COUNT.finditer(pattern) for n in m.groups() if n):
        return None  # interegular unrolls counts: large ones take too long
    body, head, tail = pattern, r"[\s\S]*", r"[\s\S]*"
    if body.startswith("^"):
        body, head = body[1:], ""
    if body.endswith("$") and not body.endswith("\\$"):
        body, tail = body[:-1], ""
    if (head == "" or tail == "") and _has_top_level_bar(body):
        return None  # ^a|b$ anchors each branch on one side only
    try:
        return interegular.parse_pattern(f"{head}(?:{body}){tail}").to_fsm()
    except Exception:  # interegular raises several kinds for syntax it lacks
        return None


def _has_top_level_bar(body: str) -> bool:
    depth, in_class, i = 0, False, 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            return True
        i += 1
    return False


def _judged_types(schema: dict) -> set[str]:
    declared = schema.get("type", list(ANY_TYPE))
    return _as_numbers(declared if isinstance(declared, list) else [declared])


def _length_bounds(s: dict, what: str) -> tuple:
    return s.get("min" + what), False, s.get("max" + what), False


def _bounds_apart(a: tuple, b: tuple) -> bool:
    """Two intervals (low, low excluded, high, high excluded) with no point in common."""
    return _ends_before(*a[2:], *b[:2]) or _ends_before(*b[2:], *a[:2])


def _ends_before(high: Any, high_excluded: bool, low: Any, low_excluded: bool) -> bool:
    """Every point up to `high` lies below every point from `low`."""
    numbers = [x for x in (high, low) if isinstance(x, (int, float)) and not isinstance(x, bool)]
    if len(numbers) < 2:
        return False
    return high < low or (high == low and (high_excluded or low_excluded))


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
