"""Objects: listed properties in the schema's order (required or optional), unlisted ones
under additionalProperties, patternProperties, propertyNames, and minProperties/maxProperties;
maps where no property is listed."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from braid.grammars.compiling.constraint_regex import escape
from braid.grammars.json_schema.errors import InvalidSchema, UnsupportedSchema
from braid.grammars.json_schema.json_text import CHAR, STRING, alternatives, compact_json
from braid.grammars.json_schema.pattern import pattern_regex
from braid.grammars.json_schema.strings import string_not_in
from braid.grammars.json_schema.values import is_valid

MAX_REPEAT = 2048  # largest maxProperties bound turned into a counted repetition


def object_regex(conv: Any, schema: dict, path: str, depth: int) -> str | None:
    """The regex of the schema's objects (`conv` is the converter)."""
    w = conv.ws
    props = schema.get("properties", {})
    required = schema.get("required", [])
    if not isinstance(props, dict) or not isinstance(required, list):
        raise InvalidSchema(f"'properties' must be an object and 'required' a list at {path}")
    extra = schema.get("additionalProperties", True)
    patterns = schema.get("patternProperties", {})
    if not isinstance(patterns, dict):
        raise InvalidSchema(f"'patternProperties' must be an object at {path}")
    names_schema = schema.get("propertyNames", True)
    if names_schema is not True and names_schema != {}:
        return _named_object(conv, schema, names_schema, path, depth)

    def schema_of(name: str) -> Any:
        """A named property's schema: listed, or additionalProperties, plus every
        patternProperties entry its name matches."""
        matched = [sub for pattern, sub in patterns.items() if name_matches(pattern, name, path)]
        base = props[name] if name in props else (True if matched else extra)
        return {"allOf": [base, *matched]} if matched else base

    names = list(props) + [r for r in required if r not in props]
    members = []  # (regex of `"key":value`, required), in schema order
    for name in names:
        value = conv.convert(schema_of(name), f"{path}/properties/{name}", depth)
        if value is None:
            if name in required:
                return None
            continue
        members.append((f"{escape(compact_json(name))}{conv.key_sep}{value}", name in required))
    lo, hi = schema.get("minProperties", 0), schema.get("maxProperties")
    if not members and names:
        # Every listed property is forbidden or cannot be written: only what is left is
        # the empty object (a map here could write a forbidden name).
        return rf"\{{{w}\}}" if lo == 0 else None
    if not members and patterns:
        # Keys written to match a pattern; a key may match several, so each value
        # obeys all of them (stricter when they do not overlap, hence safe).
        subs = list(patterns.values())
        value = conv.convert(
            subs[0] if len(subs) == 1 else {"allOf": subs}, f"{path}/patternProperties", depth
        )
        if value is None:
            return rf"\{{{w}\}}" if lo == 0 else None
        keys = [f'"{pattern_regex(p, CHAR, path)}"' for p in patterns]
        return _map(alternatives(keys), value, lo, hi, conv, path)
    if not members and extra not in (False, None) and extra != {"not": {}}:
        # A map: any keys, each value under additionalProperties.
        value = conv.convert(extra, f"{path}/additionalProperties", depth)
        if value is None:
            return rf"\{{{w}\}}" if lo == 0 else None
        return _map(STRING, value, lo, hi, conv, path)
    num_required = sum(req for _, req in members)
    # minProperties 1 over optional members only: the object is not empty.
    nonempty = lo == 1 and num_required == 0
    if (lo > num_required and not nonempty) or (hi is not None and hi < len(members)):
        raise UnsupportedSchema(f"'minProperties'/'maxProperties' at {path}")
    extra = conv.extras(schema) if not patterns and hi is None else None
    if extra is not None:
        # Unlisted properties after the listed ones, each under additionalProperties.
        value = conv.convert(extra, f"{path}/additionalProperties", depth)
        if value is not None:
            pair = f'"{string_not_in(names)}"{conv.key_sep}{value}'
            members.append((f"{pair}({conv.item_sep}{pair})*", False))
    # Members up to the first required one are written twice (members_regex): an object past
    # the regex size limit is refused before its copies are made.
    conv.check_size(sum(len(m) for m, _ in members), path)
    return rf"\{{{w}{members_regex(members, conv.item_sep, nonempty)}{w}\}}"


def _map(key: str, value: str, lo: int, hi: int | None, conv: Any, path: str) -> str:
    """An object of lo to hi members, each a key matching `key` (a string's regex) and a
    value matching `value`. A regex cannot keep keys apart, and a validator keeps one
    member of each repeated key, so more than one member cannot be required."""
    if lo > 1:
        raise UnsupportedSchema(
            f"'minProperties' {lo} at {path} on an object whose keys are not listed (a "
            "regex cannot keep its keys distinct)"
        )
    w = conv.ws
    if hi is not None:
        hi = min(hi, MAX_REPEAT)  # larger objects are not written: stricter
    if hi == 0:
        return rf"\{{{w}\}}"
    member = f"{key}{conv.key_sep}{value}"
    # The first member, then 0 to hi - 1 more (lo is at most 1).
    body = f"{member}({conv.item_sep}{member}){{0,{'' if hi is None else hi - 1}}}"
    if lo == 0:
        body = f"({body})?"
    return rf"\{{{w}{body}{w}\}}"


def _named_object(conv: Any, schema: dict, names_schema: Any, path: str, depth: int) -> str | None:
    """An object whose keys obey `propertyNames`. Listed names that break it are not
    written; finitely many names (enum, const) become listed properties; otherwise the
    keys of a map are strings under it, and unlisted properties beside listed ones are
    not written (stricter)."""
    rest = {k: v for k, v in schema.items() if k != "propertyNames"}
    props, required = dict(rest.get("properties", {})), rest.get("required", [])
    allowed = _key_check(conv, names_schema, path)
    for name in [*props, *required]:
        if not allowed(name):
            if name in required:
                return None
            props[name] = False
    finite = _finite_names(names_schema)
    if finite is not None:
        unlisted = rest.get("additionalProperties", True) if not props else conv.extras(rest)
        if unlisted is not None:
            patterns = rest.get("patternProperties", {})
            for name in finite:
                if name not in props and allowed(name):
                    matched = [s for p, s in patterns.items() if name_matches(p, name, path)]
                    props[name] = {"allOf": [unlisted, *matched]} if matched else unlisted
        closed = {"properties": props, "additionalProperties": False}
        others = {k: v for k, v in rest.items() if k != "patternProperties"}
        return object_regex(conv, {**others, **closed}, path, depth)
    if props or required:
        return object_regex(
            conv, {**rest, "properties": props, "additionalProperties": False}, path, depth
        )
    if rest.get("patternProperties"):
        raise UnsupportedSchema(
            f"'propertyNames' beside 'patternProperties' at {path} (supported: names "
            "listed, an enum or const of names, or the keys of an additionalProperties map)"
        )
    extra = rest.get("additionalProperties", True)
    lo, hi = rest.get("minProperties", 0), rest.get("maxProperties")
    value = None if extra is False else conv.convert(extra, f"{path}/additionalProperties", depth)
    key = conv.convert(
        {"allOf": [names_schema, {"type": "string"}]}, f"{path}/propertyNames", depth
    )
    if value is None or key is None:
        return rf"\{{{conv.ws}\}}" if lo == 0 else None
    return _map(key, value, lo, hi, conv, path)


def _key_check(conv: Any, names_schema: Any, path: str) -> Callable[[str], bool]:
    def allowed(name: str) -> bool:
        try:
            return is_valid(name, names_schema, conv.resolver(path))
        except UnsupportedSchema as e:
            raise UnsupportedSchema(f"'propertyNames' at {path}: {e}") from None

    return allowed


def name_matches(pattern: str, name: str, path: str) -> bool:
    """Whether a property name matches a patternProperties pattern (searched, as validators
    do)."""
    try:
        return re.search(pattern, name) is not None
    except re.error as e:
        raise UnsupportedSchema(f"patternProperties pattern {pattern!r} at {path}: {e}") from None


def _finite_names(names_schema: Any) -> list[str] | None:
    """The names a propertyNames schema lists (enum, const), if it lists them."""
    if isinstance(names_schema, dict):
        listed = [names_schema["const"]] if "const" in names_schema else names_schema.get("enum")
        if isinstance(listed, list):
            return [n for n in listed if isinstance(n, str)]
    return None


def members_regex(members: list[tuple[str, bool]], sep: str, nonempty: bool = False) -> str:
    """Members in order, each optional one present or not, commas only between present ones
    (at least one present when `nonempty`); `sep` is the regex between two members.

    Up to the first required member, `head` is "the members written so far, at least one":
    head(k) = (head(k-1) (,m_k)? | m_k). Each member appears twice in it (bare when it is the
    first written, with its comma when not), so the regex and its automaton grow linearly
    with the members; branching on the first present member and repeating the rest after
    each would copy every later member once per earlier one.
    """
    # head(k) opens one group per member after the first, so it is built as a list of the
    # pieces after those openings (re-copying a growing string was quadratic in the members).
    pieces: list[str] = []
    rest = len(members)
    for i, (m, req) in enumerate(members):
        if req:
            pieces.append(f"{sep}{m}|{m})" if pieces else m)
            rest = i + 1
            break
        pieces.append(f"({sep}{m})?|{m})" if pieces else m)
    else:
        if not pieces:
            return ""
        head = "(" * (len(pieces) - 1) + "".join(pieces)
        return f"({head})" if nonempty else f"({head})?"  # every member optional
    head = "(" * (len(pieces) - 1) + "".join(pieces)
    later = "".join(f"{sep}{m}" if req else f"({sep}{m})?" for m, req in members[rest:])
    return f"{head}{later}"
