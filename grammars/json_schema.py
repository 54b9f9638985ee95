"""JSON Schema -> regex, exact or refused.

The regex matches JSON text of valid instances, written compactly (or with the given
whitespace between tokens) with properties in the schema's order. The rule that keeps
generation safe: every text the regex matches must be valid under the schema. Being
stricter than the schema is allowed (the model just cannot write some valid documents,
e.g. extra properties or `1.0` for an integer); being looser is a bug. A keyword that
cannot be enforced exactly raises UnsupportedSchema naming it, never silently dropped.

Inside, a schema converts to a regex string, or to None when it admits no instance we can
write (an unsatisfiable branch, or recursion past MAX_DEPTH): callers drop such options.
"""

from __future__ import annotations

import json
from typing import Any

from grammars.index_builder import escape
from grammars.json_schema_pattern import pattern_regex
from grammars.json_schema_ranges import integer_regex, number_regex
from grammars.schema_errors import InvalidSchema, UnsupportedSchema

MAX_DEPTH = 4  # recursive $refs unroll this deep; deeper instances cannot be generated
MAX_REPEAT = 2048  # largest maxLength / maxItems bound turned into a counted repetition
MAX_REGEX_CHARS = 1_000_000  # a regex this long would not compile into a DFA in time

# One JSON string character, exactly one code point each (surrogate escapes excluded so
# length bounds count code points the way validators do).
CHAR = (
    r'([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u([0-9a-ce-fA-CE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}))'
)
STRING = f'"{CHAR}*"'
BOOLEAN = "(true|false)"
NULL = "null"

_DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "email": r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)*\.[a-zA-Z]{2,}",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "ipv4": r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
    r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
    "uri": r"[a-zA-Z][a-zA-Z0-9+.-]*://[a-zA-Z0-9._~:/?#@!$&'()*+,;=%-]+",
    "hostname": r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}"
    r"[a-zA-Z0-9])?)*",
}

# Keywords that describe and never constrain.
ANNOTATIONS = {
    "$schema", "$id", "id", "$comment", "title", "description", "default", "examples",
    "example", "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding",
    "$anchor", "$defs", "definitions", "discriminator", "xml", "externalDocs",
}  # fmt: skip
TYPE_KEYWORDS = {
    "string": {"minLength", "maxLength", "pattern", "format"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "object": {
        "properties", "required", "additionalProperties", "unevaluatedProperties",
        "minProperties", "maxProperties",
    },
    "array": {"items", "prefixItems", "minItems", "maxItems", "additionalItems",
              "unevaluatedItems"},
    "boolean": set(),
    "null": set(),
}  # fmt: skip
GENERAL = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "nullable"}
ALL_TYPES = tuple(TYPE_KEYWORDS)
_TYPED = set().union(*TYPE_KEYWORDS.values())
_KNOWN = ANNOTATIONS | GENERAL | _TYPED


def schema_to_regex(schema: dict[str, Any] | bool, whitespace: str | None = None) -> str:
    regex = _Converter(schema, whitespace or "").convert(schema, "#", 0)
    if regex is None:
        raise UnsupportedSchema("the schema admits no instance that can be generated")
    if len(regex) > MAX_REGEX_CHARS:
        raise UnsupportedSchema(f"the schema's regex is too large ({len(regex)} characters)")
    return regex


def _alt(options: list[str | None]) -> str | None:
    kept = list(dict.fromkeys(o for o in options if o is not None))
    if not kept:
        return None
    return kept[0] if len(kept) == 1 else "(" + "|".join(f"({o})" for o in kept) + ")"


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class _Converter:
    def __init__(self, root: dict | bool, ws: str) -> None:
        self.root = root
        self.ws = ws

    # ---- dispatch --------------------------------------------------------------------

    def convert(self, schema: Any, path: str, depth: int) -> str | None:
        if schema is True or schema == {}:
            return self.any_value(2)
        if schema is False:
            return None
        if not isinstance(schema, dict):
            raise InvalidSchema(f"a schema must be an object or a boolean at {path}")
        if "$ref" in schema:
            return self.ref(schema, path, depth)
        for key in ("allOf", "anyOf", "oneOf"):
            if key in schema:
                return getattr(self, key.lower())(schema, path, depth)
        if "const" in schema:
            return self.values([schema["const"]], schema, path)
        if "enum" in schema:
            if not isinstance(schema["enum"], list) or not schema["enum"]:
                raise InvalidSchema(f"'enum' must be a non-empty list at {path}")
            return self.values(schema["enum"], schema, path)
        self.check_keywords(schema, path)
        if "type" not in schema and not schema.keys() & _TYPED and "nullable" not in schema:
            return self.any_value(2)  # only annotations: any value
        types = self.types(schema, path)
        options = [getattr(self, t)(schema, path, depth) for t in types]
        return _alt(options)

    def types(self, schema: dict, path: str) -> list[str]:
        declared = schema.get("type")
        if declared is None:
            # Infer from the keywords present; none at all means any value.
            # Keywords of a type constrain only instances of that type and the others stay
            # valid, but we generate only the types the keywords describe (stricter, safe).
            types = [t for t in ALL_TYPES if TYPE_KEYWORDS[t] & schema.keys()]
            types = types or list(ALL_TYPES)
        else:
            types = [declared] if isinstance(declared, str) else declared
            if not isinstance(types, list) or not all(t in TYPE_KEYWORDS for t in types):
                raise InvalidSchema(f"unknown 'type' {declared!r} at {path}")
        if schema.get("nullable") is True and "null" not in types:
            types = [*types, "null"]
        if "integer" in types and "number" in types:
            types = [t for t in types if t != "integer"]
        return types

    def check_keywords(self, schema: dict, path: str) -> None:
        for key in schema:
            if key not in _KNOWN:
                raise UnsupportedSchema(f"unsupported JSON-schema keyword {key!r} at {path}")

    # ---- combinators -----------------------------------------------------------------

    def ref(self, schema: dict, path: str, depth: int) -> str | None:
        ref = schema["$ref"]
        if set(schema) - ANNOTATIONS - {"$ref"}:
            extra = sorted(set(schema) - ANNOTATIONS - {"$ref"})
            raise UnsupportedSchema(f"keywords {extra} next to '$ref' at {path}")
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise UnsupportedSchema(f"only local '$ref's (#/...) are supported, got {ref!r}")
        if depth >= MAX_DEPTH:
            return None  # recursion this deep is not generated
        target: Any = self.root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise InvalidSchema(f"'$ref' {ref!r} at {path} points at nothing")
        return self.convert(target, ref, depth + 1)

    def anyof(self, schema: dict, path: str, depth: int) -> str | None:
        return _alt(self.branches(schema, "anyOf", path, depth))

    def oneof(self, schema: dict, path: str, depth: int) -> str | None:
        # Exactly-one is anyOf when no instance can match two branches; we can tell that
        # cheaply only when the branches' types are disjoint.
        subs = schema["oneOf"]
        seen: set[str] = set()
        for i, sub in enumerate(subs if isinstance(subs, list) else []):
            types = set(self.branch_types(sub))
            if types & seen or not types:
                raise UnsupportedSchema(
                    f"'oneOf' at {path}: branch {i} may overlap another (only branches of "
                    "distinct types are supported)"
                )
            seen |= types
        return _alt(self.branches(schema, "oneOf", path, depth))

    def allof(self, schema: dict, path: str, depth: int) -> str | None:
        subs = schema["allOf"]
        if not isinstance(subs, list) or not subs:
            raise InvalidSchema(f"'allOf' must be a non-empty list at {path}")
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for sub in subs:
            if isinstance(sub, dict) and "$ref" in sub and len(sub) == 1:
                sub = self.resolve(sub["$ref"], path)
            if not isinstance(sub, dict):
                raise UnsupportedSchema(f"'allOf' with a boolean schema at {path}")
            for key, value in sub.items():
                if key in ANNOTATIONS:
                    continue
                if key == "properties":
                    props = dict(merged.get("properties", {}))
                    clash = props.keys() & value.keys()
                    if clash:
                        raise UnsupportedSchema(
                            f"'allOf' at {path} constrains property {sorted(clash)[0]!r} twice"
                        )
                    merged["properties"] = {**props, **value}
                elif key == "required":
                    merged["required"] = list(dict.fromkeys(merged.get("required", []) + value))
                elif key in merged and merged[key] != value:
                    raise UnsupportedSchema(f"'allOf' at {path} combines two {key!r} keywords")
                else:
                    merged[key] = value
        return self.convert(merged, path, depth)

    def branches(self, schema: dict, key: str, path: str, depth: int) -> list[str | None]:
        subs = schema[key]
        if not isinstance(subs, list) or not subs:
            raise InvalidSchema(f"'{key}' must be a non-empty list at {path}")
        rest = {k: v for k, v in schema.items() if k != key and k not in ANNOTATIONS}
        if rest:
            # Sibling keywords apply to every branch: fold them in as an allOf.
            return [
                self.convert({"allOf": [rest, sub]}, f"{path}/{key}/{i}", depth)
                for i, sub in enumerate(subs)
            ]
        return [self.convert(sub, f"{path}/{key}/{i}", depth) for i, sub in enumerate(subs)]

    def branch_types(self, sub: Any) -> list[str]:
        if isinstance(sub, dict) and "$ref" in sub:
            sub = self.resolve(sub["$ref"], "oneOf")
        if not isinstance(sub, dict):
            return list(ALL_TYPES)
        if "const" in sub or "enum" in sub:
            values = [sub["const"]] if "const" in sub else sub["enum"]
            return [_json_type(v) for v in values]
        if any(k in sub for k in ("anyOf", "oneOf", "allOf")):
            return list(ALL_TYPES)
        types = self.types(sub, "oneOf")
        return ["number" if t == "integer" else t for t in types]

    def resolve(self, ref: str, path: str) -> Any:
        target: Any = self.root
        for part in filter(None, ref.lstrip("#").split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise InvalidSchema(f"'$ref' {ref!r} at {path} points at nothing")
            target = target[part]
        return target

    # ---- values --------------------------------------------------------------------

    def values(self, values: list, schema: dict, path: str) -> str | None:
        allowed = set(ANNOTATIONS) | {"enum", "const", "type", "nullable"}
        extra = set(schema) - allowed
        if extra:
            raise UnsupportedSchema(f"keyword {sorted(extra)[0]!r} next to enum/const at {path}")
        if "type" in schema:
            types = self.types(schema, path)
            values = [v for v in values if _json_type(v) in types or
                      (_json_type(v) == "number" and "integer" in types and float(v).is_integer()
                       and isinstance(v, int))]  # fmt: skip
        if not values:
            return None
        if self.ws and any(isinstance(v, (dict, list)) and v for v in values):
            raise UnsupportedSchema(f"enum/const of objects or arrays with whitespace at {path}")
        return _alt([escape(_dump(v)) for v in values])

    def any_value(self, depth: int) -> str:
        """Any JSON value nested at most `depth` containers deep."""
        scalar = f"({STRING}|{number_regex(None, None, False, False)}|{BOOLEAN}|{NULL})"
        value = scalar
        w = self.ws
        for _ in range(depth):
            array = rf"\[{w}({value}({w},{w}{value})*)?{w}\]"
            member = f"{STRING}{w}:{w}{value}"
            obj = rf"\{{{w}({member}({w},{w}{member})*)?{w}\}}"
            value = f"({scalar}|{array}|{obj})"
        return value

    def string(self, schema: dict, path: str, depth: int) -> str | None:
        lo, hi = schema.get("minLength", 0), schema.get("maxLength")
        _check_bound(lo, hi, "minLength", "maxLength", path)
        fmt, pattern = schema.get("format"), schema.get("pattern")
        if fmt is not None and pattern is not None:
            raise UnsupportedSchema(f"'format' together with 'pattern' at {path}")
        if fmt is not None or pattern is not None:
            if (lo, hi) != (0, None):
                raise UnsupportedSchema(f"length bounds with 'format' or 'pattern' at {path}")
            if pattern is not None:
                return f'"{pattern_regex(pattern, CHAR, path)}"'
            if fmt not in FORMATS:
                raise UnsupportedSchema(f"unsupported string format {fmt!r} at {path}")
            return f'"{FORMATS[fmt]}"'
        if hi is None:
            return f'"{CHAR}{{{lo},}}"' if lo else STRING
        if hi > MAX_REPEAT:
            raise UnsupportedSchema(f"maxLength {hi} at {path} exceeds {MAX_REPEAT}")
        return f'"{CHAR}{{{lo},{hi}}}"'

    def integer(self, schema: dict, path: str, depth: int) -> str | None:
        lo, hi = _bounds(schema, path, integer=True)
        step = schema.get("multipleOf")
        if step is not None and step != 1:
            raise UnsupportedSchema(f"'multipleOf' {step} at {path} (only 1 for integers)")
        return integer_regex(lo, hi)

    def number(self, schema: dict, path: str, depth: int) -> str | None:
        if "multipleOf" in schema:
            raise UnsupportedSchema(f"'multipleOf' on a number at {path}")
        lo, lo_excl, hi, hi_excl = _number_bounds(schema, path)
        return number_regex(lo, hi, lo_excl, hi_excl, path)

    def boolean(self, schema: dict, path: str, depth: int) -> str:
        return BOOLEAN

    def null(self, schema: dict, path: str, depth: int) -> str:
        return NULL

    def object(self, schema: dict, path: str, depth: int) -> str | None:
        w = self.ws
        props = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(props, dict) or not isinstance(required, list):
            raise InvalidSchema(f"'properties' must be an object and 'required' a list at {path}")
        extra = schema.get("additionalProperties", schema.get("unevaluatedProperties", True))
        names = list(props) + [r for r in required if r not in props]
        members = []  # (regex of `"key":value`, required), in schema order
        for name in names:
            value = self.convert(props.get(name, True), f"{path}/properties/{name}", depth)
            if value is None:
                if name in required:
                    return None
                continue
            members.append((f"{escape(_dump(name))}{w}:{w}{value}", name in required))
        lo, hi = schema.get("minProperties", 0), schema.get("maxProperties")
        if not members and extra not in (False, None) and extra != {"not": {}}:
            # A map: any keys, each value under additionalProperties.
            value = self.convert(extra, f"{path}/additionalProperties", depth)
            if value is None:
                return rf"\{{{w}\}}" if lo == 0 else None
            member = f"{STRING}{w}:{w}{value}"
            return _sequence(r"\{", r"\}", member, lo, hi, w, path, "Properties")
        num_required = sum(req for _, req in members)
        if lo > num_required or (hi is not None and hi < len(members)):
            raise UnsupportedSchema(f"'minProperties'/'maxProperties' at {path}")
        return rf"\{{{w}{_members(members, w)}{w}\}}"

    def array(self, schema: dict, path: str, depth: int) -> str | None:
        w = self.ws
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", True)
        if isinstance(items, list):  # draft 4-7 tuple form
            prefix, items = items, schema.get("additionalItems", True)
        lo, hi = schema.get("minItems", 0), schema.get("maxItems")
        _check_bound(lo, hi, "minItems", "maxItems", path)
        if prefix:
            return self.tuple(prefix, items, lo, hi, path, depth)
        item = self.convert(items, f"{path}/items", depth)
        if item is None:
            return rf"\[{w}\]" if lo == 0 else None
        return _sequence(r"\[", r"\]", item, lo, hi, w, path, "Items")

    def tuple(
        self, prefix: list, rest: Any, lo: int, hi: int | None, path: str, depth: int
    ) -> str | None:
        w = self.ws
        if rest not in (False, None) or lo > len(prefix) or (hi is not None and hi < len(prefix)):
            raise UnsupportedSchema(
                f"tuple arrays at {path} are supported with exactly their listed items"
            )
        parts = [self.convert(s, f"{path}/prefixItems/{i}", depth) for i, s in enumerate(prefix)]
        if any(p is None for p in parts):
            return None
        return rf"\[{w}" + f"{w},{w}".join(parts) + rf"{w}\]"


def _members(members: list[tuple[str, bool]], w: str) -> str:
    """Members in order, each optional one present or not, commas only between present ones.

    first(i): what may follow when nothing was written yet; later(i): after something was.
    later is linear; first branches on the first present member, and stops branching at the
    first required one (it must be the first written or come after one).
    """
    sep = f"{w},{w}"

    def later(i: int) -> str:
        return "".join(f"{sep}{m}" if req else f"({sep}{m})?" for m, req in members[i:])

    options = []
    for i, (m, req) in enumerate(members):
        options.append(f"{m}{later(i + 1)}")
        if req:
            break
    else:
        options.append("")  # every member is optional: the empty object
    return options[0] if len(options) == 1 else "(" + "|".join(f"({o})" for o in options) + ")"


def _sequence(
    open_: str, close: str, item: str, lo: int, hi: int | None, w: str, path: str, what: str
) -> str:
    sep = f"{w},{w}"
    if hi is not None and hi > MAX_REPEAT:
        raise UnsupportedSchema(f"max{what} {hi} at {path} exceeds {MAX_REPEAT}")
    if hi == 0:
        return f"{open_}{w}{close}"
    more_lo = max(lo - 1, 0)
    more = f"({sep}{item}){{{more_lo},{'' if hi is None else hi - 1}}}"
    body = f"{item}{more}"
    if lo == 0:
        body = f"({body})?"
    return f"{open_}{w}{body}{w}{close}"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _check_bound(lo: Any, hi: Any, lo_name: str, hi_name: str, path: str) -> None:
    if (
        not isinstance(lo, int)
        or lo < 0
        or (hi is not None and (not isinstance(hi, int) or hi < 0))
    ):
        raise InvalidSchema(f"'{lo_name}'/'{hi_name}' must be non-negative integers at {path}")
    if hi is not None and lo > hi:
        raise UnsupportedSchema(f"'{lo_name}' {lo} > '{hi_name}' {hi} at {path}: unsatisfiable")


def _number_bounds(schema: dict, path: str) -> tuple[Any, bool, Any, bool]:
    """(low, low exclusive, high, high exclusive), accepting draft-4 boolean exclusives."""
    lo, hi = schema.get("minimum"), schema.get("maximum")
    lo_excl = hi_excl = False
    ex_lo, ex_hi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if isinstance(ex_lo, bool):
        lo_excl = ex_lo and lo is not None
    elif ex_lo is not None:
        if lo is None or ex_lo >= lo:
            lo, lo_excl = ex_lo, True
    if isinstance(ex_hi, bool):
        hi_excl = ex_hi and hi is not None
    elif ex_hi is not None:
        if hi is None or ex_hi <= hi:
            hi, hi_excl = ex_hi, True
    for b in (lo, hi):
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float))):
            raise InvalidSchema(f"numeric bounds must be numbers at {path}")
    if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_excl or hi_excl))):
        raise UnsupportedSchema(f"bounds at {path} admit no number: unsatisfiable")
    return lo, lo_excl, hi, hi_excl


def _bounds(schema: dict, path: str, integer: bool) -> tuple[int | None, int | None]:
    """Inclusive integer bounds."""
    import math

    lo, lo_excl, hi, hi_excl = _number_bounds(schema, path)
    if lo is not None:
        lo = math.floor(lo) + 1 if lo_excl and float(lo).is_integer() else math.ceil(lo)
        lo = int(lo)
    if hi is not None:
        hi = math.ceil(hi) - 1 if hi_excl and float(hi).is_integer() else math.floor(hi)
        hi = int(hi)
    if lo is not None and hi is not None and lo > hi:
        raise UnsupportedSchema(f"no integer lies within the bounds at {path}: unsatisfiable")
    return lo, hi
