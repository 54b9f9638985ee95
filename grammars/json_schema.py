"""JSON Schema -> regex, exact or refused.

The regex matches JSON text of valid instances, written compactly (or with the given
whitespace between tokens) with properties in the schema's order. The rule that keeps
generation safe: every text the regex matches must be valid under the schema. Being
stricter than the schema is allowed (the model just cannot write some valid documents,
e.g. extra properties or `1.0` for an integer); being looser is a bug. A keyword that
cannot be enforced exactly raises UnsupportedSchema naming it, never silently dropped.
Keywords the spec does not define (`x-...`, `javaType`, typos) are annotations and ignored,
as validators ignore them.

Inside, a schema converts to a regex string, or to None when it admits no instance we can
write (an unsatisfiable branch, or $refs past the depth limit): callers drop such options.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

from braid.grammars.index_builder import escape
from braid.grammars.json_schema_not import (
    excluded_values,
    forbidden_names,
    negated_condition,
    required_clauses,
)
from braid.grammars.json_schema_oneof import exclusive_branches
from braid.grammars.json_schema_pattern import pattern_regex
from braid.grammars.json_schema_ranges import integer_regex, number_bounds, number_regex
from braid.grammars.json_schema_values import is_type, is_valid, json_equal
from braid.grammars.schema_errors import InvalidSchema, UnsupportedSchema

# $refs are followed this deep (recursion unrolls); deeper instances cannot be generated.
# A regex past MAX_REGEX_CHARS is converted again one level shallower (down to MIN_DEPTH).
MAX_DEPTH = 4
MIN_DEPTH = 2
MAX_REPEAT = 2048  # largest maxItems / maxProperties bound turned into a counted repetition
MAX_REGEX_CHARS = 4_000_000  # past this the lazy automaton's NFA nears its 8M-node limit

# One JSON string character, exactly one code point each (surrogate escapes excluded so
# a pattern's counted repetitions count code points the way validators do).
CHAR = (
    r'([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u([0-9a-ce-fA-CE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}))'
)
STRING = f'"{CHAR}*"'
# Counted characters (minLength/maxLength) cost automaton states per count: a plain character
# one, a two-character escape (\n, \", ...) one more, a \u escape six more. Counted strings
# take plain characters and the two-character escapes (a quote or a newline in a bounded
# description is ordinary) but not \u escapes (stricter, hence safe); a maxLength above
# MAX_STRING_CHARS generates at most that many. (Which backend compiles the regex, an eager
# outlines index or the lazy automaton, is index_builder's choice.) Patterns and formats
# under length bounds count plain characters only.
PLAIN_CHAR = r'[^"\\\x00-\x1f]'
COUNTED_CHAR = r'([^"\\\x00-\x1f]|\\["\\/bfnrt])'
MAX_STRING_CHARS = 4096
BOOLEAN = "(true|false)"
NULL = "null"

# RFC 3986 URIs and references, host names as reg-names (IP literals like [::1] are left
# out: stricter, safe). _U: the characters every component allows (unreserved, sub-delims,
# percent-escapes); a path segment adds ":" and "@" (_P), a first relative segment only "@".
_U = r"([a-zA-Z0-9._~!$&'()*+,;=-]|%[0-9a-fA-F]{2})"
_P = rf"({_U}|[:@])"
_AUTHORITY = rf"//(({_U}|:)*@)?{_U}*(:[0-9]*)?(/({_P}|/)*)?"
_QUERY_FRAGMENT = rf"(\?({_P}|[/?])*)?(#({_P}|[/?])*)?"
_ABSOLUTE_PATH = rf"/({_P}({_P}|/)*)?"
_URI = rf"[a-zA-Z][a-zA-Z0-9+.-]*:({_AUTHORITY}|{_ABSOLUTE_PATH}|{_P}({_P}|/)*)?{_QUERY_FRAGMENT}"
_RELATIVE_REF = rf"({_AUTHORITY}|{_ABSOLUTE_PATH}|({_U}|@)+(/({_P}|/)*)?)?{_QUERY_FRAGMENT}"
# RFC 3339 durations (its appendix A): designators in order, none skipped between years and
# days, weeks alone, whole numbers only (ISO 8601's fractions are left out: stricter, safe).
_DURATION_TIME = "T([0-9]+H([0-9]+M([0-9]+S)?)?|[0-9]+M([0-9]+S)?|[0-9]+S)"
_DURATION = (
    f"P(([0-9]+D|[0-9]+M([0-9]+D)?|[0-9]+Y([0-9]+M([0-9]+D)?)?)({_DURATION_TIME})?"
    f"|{_DURATION_TIME}|[0-9]+W)"
)
# Real calendar dates (validators check them: 2023-02-29 and 2024-04-31 are not dates):
# days 1-28 in any month, 29-30 outside February, 31 in the long months, February 29 in
# leap years (divisible by 4, centuries only by 400). Year 0000 does not exist.
_YEAR = "([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_LEAP_YEAR = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|([2468][048]|[13579][26]|0[48])00)"
_MONTH_DAY = "((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)"
_DATE = f"({_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "email": r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)*\.[a-zA-Z]{2,}",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "ipv4": r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
    r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
    "uri": _URI,
    "hostname": r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}"
    r"[a-zA-Z0-9])?)*",
    # Stricter than the format (the full form only): safe.
    "ipv6": r"([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}",
    "uri-reference": f"({_URI}|{_RELATIVE_REF})",
    "duration": _DURATION,
    "byte": r"([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?",
}
# Formats the spec defines that we have no regex for: refused by name. Other names (custom
# or OpenAPI hints like "password") are annotations, as validators treat unknown formats.
MISSING_FORMATS = {
    "idn-email", "idn-hostname", "iri", "iri-reference", "uri-template", "json-pointer",
    "relative-json-pointer", "regex",
}  # fmt: skip

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
        "minProperties", "maxProperties", "patternProperties",
    },
    "array": {"items", "prefixItems", "minItems", "maxItems", "additionalItems",
              "unevaluatedItems"},
    "boolean": set(),
    "null": set(),
}  # fmt: skip
GENERAL = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "nullable", "not"}
# Validation keywords a regex cannot enforce (or that we do not yet): refused by name.
UNSUPPORTED = {
    "uniqueItems", "contains", "minContains", "maxContains", "propertyNames", "$dynamicRef",
    "$recursiveRef",
}  # fmt: skip
ALL_TYPES = tuple(TYPE_KEYWORDS)
_TYPED = set().union(*TYPE_KEYWORDS.values())
# The lengths a format's strings can have, where (1, None) does not say it: length bounds
# that hold for every such length need no lookahead.
FORMAT_LENGTHS = {
    "date": (10, 10), "uuid": (36, 36), "ipv4": (7, 15), "uri-reference": (0, None),
    "byte": (0, None),
}  # fmt: skip
# Draft 4-7 `dependencies` (both forms) and their 2019-09 names: expanded into anyOf.
DEPENDENCIES = ("dependencies", "dependentRequired", "dependentSchemas")
MAX_DEPENDENCIES = 4  # each one doubles the alternatives
CONDITIONAL = ("if", "then", "else")
_CONSTRAINING = GENERAL | _TYPED | UNSUPPORTED | set(DEPENDENCIES) | {"if"}
_KEYED = ("properties", "patternProperties")  # name -> schema maps, merged by name


def schema_to_regex(
    schema: dict[str, Any] | bool, whitespace: str | None = None, strict: bool = True
) -> str:
    too_large = None
    for depth in range(MAX_DEPTH, MIN_DEPTH - 1, -1):
        try:
            regex = _Converter(schema, whitespace or "", depth, strict).convert(schema, "#", 0)
        except _TooLarge as e:
            too_large = too_large or e
            continue
        if regex is None:
            raise too_large or UnsupportedSchema(
                "the schema admits no instance that can be generated"
            )
        return regex
    raise too_large


class _TooLarge(UnsupportedSchema):
    pass


# A pattern that is one character (class, escape or literal) repeated, anchored at both ends.
_ONE_REPEATED = re.compile(
    r"\^(\[(?:\\.|[^\]\\])+\]|\\[dwsDWS]|\.|[^\\^$.|?*+()\[\]{}])"
    r"([+*]|\{\d+(?:,\d*)?\})\$"
)


def _alt(options: list[str | None]) -> str | None:
    kept = list(dict.fromkeys(o for o in options if o is not None))
    if not kept:
        return None
    return kept[0] if len(kept) == 1 else "(" + "|".join(f"({o})" for o in kept) + ")"


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class _Converter:
    def __init__(
        self,
        root: dict | bool,
        ws: str,
        depth: int = MAX_DEPTH,
        strict: bool = True,
    ) -> None:
        self.root = root
        self.ws = ws
        self.strict = strict  # unlisted properties only where additionalProperties says so
        self.max_depth = depth  # $refs followed

    # ---- dispatch --------------------------------------------------------------------

    def convert(self, schema: Any, path: str, depth: int) -> str | None:
        regex = self._convert(schema, path, depth)
        if regex is not None and len(regex) > MAX_REGEX_CHARS:
            raise _TooLarge(f"the schema's regex is too large at {path}")
        return regex

    def _convert(self, schema: Any, path: str, depth: int) -> str | None:
        if schema is True or schema == {}:
            return self.any_value(2)
        if schema is False:
            return None
        if not isinstance(schema, dict):
            raise InvalidSchema(f"a schema must be an object or a boolean at {path}")
        if schema.get("format") not in (None, *FORMATS, *MISSING_FORMATS):
            # A custom format is an annotation: it neither constrains nor implies a string.
            schema = {k: v for k, v in schema.items() if k != "format"}
        # A finite set first: its values are checked against every other keyword.
        if "const" in schema:
            return self.values([schema["const"]], "const", schema, path)
        if "enum" in schema:
            if not isinstance(schema["enum"], list) or not schema["enum"]:
                raise InvalidSchema(f"'enum' must be a non-empty list at {path}")
            return self.values(schema["enum"], "enum", schema, path)
        if "if" in schema:
            return self.convert(self.unconditional(schema, path), path, depth)
        if "$ref" in schema:
            rest = {k: v for k, v in schema.items() if k in _CONSTRAINING and k != "$ref"}
            if rest:  # siblings of $ref apply too (2019-09; stricter than draft 7, so safe)
                return self.allof({"allOf": [{"$ref": schema["$ref"]}, rest]}, path, depth)
            return self.ref(schema, path, depth)
        if "not" in schema and (clauses := required_clauses(schema["not"])) is not None:
            rest = {k: v for k, v in schema.items() if k != "not"}
            names = forbidden_names(clauses, rest.get("required"))
            gone = {"properties": {name: False for name in names}}
            return self.convert({"allOf": [rest, gone]}, path, depth)
        if schema.keys() & set(DEPENDENCIES):
            return self.dependent(schema, path, depth)
        for key in ("allOf", "anyOf", "oneOf"):
            if key in schema:
                return getattr(self, key.lower())(schema, path, depth)
        if "not" in schema and (excluded := excluded_values(schema["not"])) is not None:
            return self.without_values(schema, *excluded, path, depth)
        self.check_keywords(schema, path)
        if not schema.keys() & _CONSTRAINING:
            return self.any_value(2)  # only annotations: any value
        types = self.types(schema, path)
        options = [getattr(self, t)(schema, path, depth) for t in types]
        return _alt(options)

    def types(self, schema: dict, path: str) -> list[str]:
        types = self.declared_types(schema, path)
        if "not" in schema:  # only `not` of types is a regex: drop those types
            gone = self.excluded_types(schema["not"], path)
            types = [t for t in types if t not in gone and (t != "integer" or "number" not in gone)]
        return types

    def excluded_types(self, excluded: Any, path: str) -> list[str]:
        if isinstance(excluded, dict) and set(excluded) - ANNOTATIONS == {"type"}:
            return self.declared_types(excluded, path)
        if isinstance(excluded, dict) and set(excluded) - ANNOTATIONS == {"anyOf"}:
            return [t for sub in excluded["anyOf"] for t in self.excluded_types(sub, path)]
        if excluded is True or excluded == {}:
            return list(ALL_TYPES)
        raise UnsupportedSchema(
            f"keyword 'not' at {path} (supported: 'not' of types, of const/enum values "
            "and of required properties)"
        )

    def declared_types(self, schema: dict, path: str) -> list[str]:
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
        for key in schema.keys() & UNSUPPORTED:
            if key == "uniqueItems" and (schema[key] is False or schema.get("maxItems", 2) <= 1):
                continue
            raise UnsupportedSchema(f"unsupported JSON-schema keyword {key!r} at {path}")

    # ---- combinators -----------------------------------------------------------------

    def ref(self, schema: dict, path: str, depth: int) -> str | None:
        ref = schema["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise UnsupportedSchema(f"only local '$ref's (#/...) are supported, got {ref!r}")
        if depth >= self.max_depth:
            return None  # recursion this deep is not generated
        return self.convert(self.resolve(ref, path), ref, depth + 1)

    def anyof(self, schema: dict, path: str, depth: int) -> str | None:
        return _alt(self.branches(schema, "anyOf", path, depth))

    def oneof(self, schema: dict, path: str, depth: int) -> str | None:
        subs = schema["oneOf"]
        if not isinstance(subs, list) or not subs:
            raise InvalidSchema(f"'oneOf' must be a non-empty list at {path}")
        rest = {k: v for k, v in schema.items() if k != "oneOf"}
        subs = exclusive_branches(subs, rest, self, path, depth)
        return _alt(self.branches({**schema, "oneOf": subs}, "oneOf", path, depth))

    def dependent(self, schema: dict, path: str, depth: int) -> str | None:
        """Property dependencies as alternatives: for each one, either its property is
        absent, or it is present with what it requires (more names, or a schema)."""
        base = {k: v for k, v in schema.items() if k not in DEPENDENCIES}
        rules: list[tuple[str, dict]] = []
        for key in DEPENDENCIES:
            table = schema.get(key, {})
            if not isinstance(table, dict):
                raise InvalidSchema(f"'{key}' must be an object at {path}")
            for name, need in table.items():
                if isinstance(need, list):
                    if need:
                        rules.append((name, {"required": [name, *need]}))
                elif need is not True and need != {}:
                    rules.append((name, {"allOf": [{"required": [name]}, need]}))
        if len(rules) > MAX_DEPENDENCIES:
            raise UnsupportedSchema(
                f"{len(rules)} property dependencies at {path} (at most {MAX_DEPENDENCIES})"
            )
        if not rules:
            return self.convert(base, path, depth)
        variants = [base]
        for name, present in rules:
            absent = {"properties": {name: False}}
            variants = [{"allOf": [v, extra]} for v in variants for extra in (absent, present)]
        return self.convert({"anyOf": variants}, path, depth)

    def unconditional(self, schema: dict, path: str) -> dict:
        """if/then/else as (if and then) or (not-if and else): exact where the condition's
        negation is a schema (json_schema_not.negated_condition)."""
        condition = self.deref(schema["if"])
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

    def without_values(
        self, schema: dict, values: list, types: list[str], path: str, depth: int
    ) -> str | None:
        """Each type of the schema minus the values (and whole types) its `not` names."""
        rest = {k: v for k, v in schema.items() if k != "not"}
        options = []
        for t in self.types(rest, path):
            if t in types or (t == "integer" and "number" in types):
                continue
            hit = [v for v in values if is_type(v, t) and self.may_write(v, rest, t, path)]
            if not hit:
                options.append(getattr(self, t)(rest, path, depth))
            elif t == "boolean":
                left = [b for b in (True, False) if not any(json_equal(b, v) for v in hit)]
                options.append(_alt([_dump(b) for b in left]))
            elif t == "string" and not rest.keys() & TYPE_KEYWORDS["string"]:
                options.append(f'"{_string_not_in(hit)}"')
            elif t == "integer":
                options.append(self.integer_except(rest, hit, path))
            elif t != "null":
                raise UnsupportedSchema(
                    f"keyword 'not' at {path} excludes a {t} value (values are excluded "
                    "from plain strings, integers, booleans and null)"
                )
        return _alt(options)

    def may_write(self, value: Any, schema: dict, t: str, path: str) -> bool:
        """Whether `value` is valid under the schema's keywords for type t (True when they
        cannot be checked: the value is then excluded, stricter and so safe)."""
        try:
            return is_valid(value, {**schema, "type": t}, lambda ref: self.resolve(ref, path))
        except UnsupportedSchema:
            return True

    def integer_except(self, schema: dict, excluded: list, path: str) -> str | None:
        """The integers within the schema's bounds, less `excluded`."""
        lo, hi = _integer_bounds(schema, path)
        step = schema.get("multipleOf")
        if step is not None and step != 1:
            raise UnsupportedSchema(f"'multipleOf' {step} at {path} (only 1 for integers)")
        inside = {int(v) for v in excluded if (lo is None or v >= lo) and (hi is None or v <= hi)}
        cuts = sorted(inside)
        pieces, start = [], lo
        for cut in cuts:
            pieces.append(integer_regex(start, cut - 1))
            start = cut + 1
        pieces.append(integer_regex(start, hi))
        return _alt(pieces)

    def allof(self, schema: dict, path: str, depth: int) -> str | None:
        """All parts merged into one schema (exact for the keywords merged below)."""
        parts: list[dict] = []
        deeper = self.collect_parts(schema, path, depth, parts)
        if deeper is None:
            return None
        merged: dict[str, Any] = {}
        checks: list[dict] = []  # conflicting enum/const: kept as checks on the values
        for part in parts:
            for key, value in part.items():
                if key not in _CONSTRAINING:
                    continue
                if key not in merged:
                    merged[key] = dict(value) if key in _KEYED else value
                elif key in _KEYED:
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
                elif key == "anyOf" and len(merged[key]) * len(value) <= 64:
                    merged[key] = [{"allOf": [x, y]} for x in merged[key] for y in value]
                elif key in ("enum", "const"):
                    checks.append({key: value})
                elif key == "items" and _plain_items(parts):
                    merged[key] = {"allOf": [merged[key], value]}
                elif key == "additionalProperties" and not any(
                    "patternProperties" in p for p in parts
                ):
                    # Properties no part lists obey both (close_properties handles the
                    # properties one part lists and another does not).
                    merged[key] = _both_extras(merged[key], value)
                elif not json_equal(merged[key], value):
                    raise UnsupportedSchema(f"'allOf' at {path} combines two {key!r} keywords")
        if checks:
            merged["allOf"] = checks
        if not self.close_properties(parts, merged, path):
            return None
        return self.convert(merged, path, deeper)

    def collect_parts(self, schema: Any, path: str, depth: int, parts: list[dict]) -> int | None:
        """Flatten nested allOf and $refs into `parts`; the depth reached (None: no value)."""
        if schema is True:
            return depth
        if schema is False:
            return None
        if not isinstance(schema, dict):
            raise InvalidSchema(f"'allOf' entries must be schemas at {path}")
        if "if" in schema:
            schema = self.unconditional(schema, path)
        deepest = depth
        if "$ref" in schema:
            if depth >= self.max_depth:
                return None
            target = self.resolve(schema["$ref"], path)
            deepest = self.collect_parts(target, path, depth + 1, parts)
            if deepest is None:
                return None
        subs = schema.get("allOf", [])
        if not isinstance(subs, list) or ("allOf" in schema and not subs):
            raise InvalidSchema(f"'allOf' must be a non-empty list at {path}")
        parts.append({k: v for k, v in schema.items() if k not in ("allOf", "$ref")})
        for sub in subs:
            reached = self.collect_parts(sub, path, depth, parts)
            if reached is None:
                return None
            deepest = max(deepest, reached)
        return deepest

    def close_properties(self, parts: list[dict], merged: dict, path: str) -> bool:
        """additionalProperties in one part forbids the other parts' extra properties: drop
        them (False if one of them is required)."""
        for part in parts:
            extra = part.get("additionalProperties", True)
            if extra is True or extra == {}:
                continue
            if extra is not False:
                if set(merged.get("properties", {})) - set(part.get("properties", {})):
                    raise UnsupportedSchema(
                        f"'allOf' at {path}: additionalProperties with a schema meets "
                        "another part's properties"
                    )
                continue
            allowed = set(part.get("properties", {}))
            patterns = part.get("patternProperties", {})
            for name in list(merged.get("properties", {})):
                if name not in allowed and not any(_search(p, name, path) for p in patterns):
                    if name in merged.get("required", []):
                        return False
                    del merged["properties"][name]
            merged["additionalProperties"] = False
        return True

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

    def deref(self, schema: Any) -> Any:
        """A chain of bare $refs followed to what it names."""
        for _ in range(8):
            if isinstance(schema, dict) and set(schema) - ANNOTATIONS == {"$ref"}:
                schema = self.resolve(schema["$ref"], "#")
        return schema

    def resolve(self, ref: str, path: str) -> Any:
        target = resolve_pointer(self.root, ref)
        if target is _MISSING:
            raise InvalidSchema(f"'$ref' {ref!r} at {path} points at nothing")
        return target

    # ---- values --------------------------------------------------------------------

    def values(self, values: list, key: str, schema: dict, path: str) -> str | None:
        """A finite set: the values also valid under the schema's other keywords."""
        rest = {k: v for k, v in schema.items() if k != key}
        kept = [v for v in values if is_valid(v, rest, lambda ref: self.resolve(ref, path))]
        if not kept:
            return None
        if self.ws and any(isinstance(v, (dict, list)) and v for v in kept):
            raise UnsupportedSchema(f"enum/const of objects or arrays with whitespace at {path}")
        return _alt([escape(_dump(v)) for v in kept])

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
        if fmt in MISSING_FORMATS:
            raise UnsupportedSchema(f"unsupported string format {fmt!r} at {path}")
        if fmt is not None and pattern is not None:
            raise UnsupportedSchema(f"'format' together with 'pattern' at {path}")
        if pattern is not None:
            if (lo, hi) != (0, None):
                return self.counted_pattern(pattern, lo, hi, path)
            return f'"{pattern_regex(pattern, CHAR, path)}"'
        if fmt is not None:
            shortest, longest = FORMAT_LENGTHS.get(fmt, (1, None))
            if lo > shortest or (hi is not None and (longest is None or hi < longest)):
                return self.length_bounded(FORMATS[fmt], lo, hi, path)  # formats are plain
            return f'"{FORMATS[fmt]}"'
        if lo > MAX_STRING_CHARS:
            raise UnsupportedSchema(f"minLength {lo} at {path} exceeds {MAX_STRING_CHARS}")
        if hi is None:
            return f'"{COUNTED_CHAR}{{{lo}}}{CHAR}*"' if lo else STRING
        return f'"{COUNTED_CHAR}{{{lo},{min(hi, max(lo, MAX_STRING_CHARS))}}}"'

    def counted_pattern(self, pattern: Any, lo: int, hi: int | None, path: str) -> str | None:
        """Length bounds next to a pattern. One repeated character (`^[a-z]+$`): the two
        counts meet, a plain regex. Any other: a length lookahead (length_bounded)."""
        match = _ONE_REPEATED.fullmatch(pattern) if isinstance(pattern, str) else None
        if match is None:
            content = pattern_regex(pattern, PLAIN_CHAR, path, plain=True)
            return self.length_bounded(content, lo, hi, path)
        atom, quantifier = match.groups()
        if quantifier in ("+", "*"):
            q_lo, q_hi = (1 if quantifier == "+" else 0), None
        else:
            low, comma, high = quantifier[1:-1].partition(",")
            q_lo = int(low)
            q_hi = int(high) if high else (None if comma else q_lo)
        lo = max(lo, q_lo)
        if q_hi is not None:
            hi = q_hi if hi is None else min(hi, q_hi)
        if lo > MAX_STRING_CHARS:
            raise UnsupportedSchema(f"minLength {lo} at {path} exceeds {MAX_STRING_CHARS}")
        if hi is not None and lo > hi:
            return None
        char = pattern_regex(f"^{atom}$", CHAR, path)  # one code point, encoded
        top = "" if hi is None else min(hi, max(lo, MAX_STRING_CHARS))
        return f'"{char}{{{lo},{top}}}"'

    def length_bounded(self, content: str, lo: int, hi: int | None, path: str) -> str | None:
        """A string whose content matches `content` (a regex of plain characters, one per
        string character) and has lo to hi characters: `(?=C{lo,hi}")(content)"`, a
        lookahead Python's re reads as written and the lazy automaton compiles as the
        intersection (outlines cannot, so these regexes go to the lazy automaton)."""
        if lo > MAX_STRING_CHARS:
            raise UnsupportedSchema(f"minLength {lo} at {path} exceeds {MAX_STRING_CHARS}")
        if hi is not None and lo > hi:
            return None
        top = "" if hi is None else min(hi, max(lo, MAX_STRING_CHARS))
        return f'"(?={PLAIN_CHAR}{{{lo},{top}}}")({content})"'

    def integer(self, schema: dict, path: str, depth: int) -> str | None:
        return self.integer_except(schema, [], path)

    def number(self, schema: dict, path: str, depth: int) -> str | None:
        if "multipleOf" in schema:
            return self.number_multiple(schema, path, depth)
        lo, lo_excl, hi, hi_excl = _number_bounds(schema, path)
        return number_regex(lo, hi, lo_excl, hi_excl)

    def number_multiple(self, schema: dict, path: str, depth: int) -> str | None:
        """multipleOf 1 on a number: the integers within the bounds (2.0 is valid too, but
        not written: stricter, safe). multipleOf 0.1, 0.01, ... without bounds: decimals of
        at most that many fraction digits."""
        step = schema["multipleOf"]
        if isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0:
            raise InvalidSchema(f"'multipleOf' must be a positive number at {path}")
        if step == 1:
            return self.integer(schema, path, depth)
        places = -Decimal(repr(step)).normalize().as_tuple().exponent
        unbounded = not schema.keys() & {
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
        }
        if places > 0 and Decimal(repr(step)) == Decimal(1).scaleb(-places) and unbounded:
            return rf"-?(0|[1-9][0-9]*)(\.[0-9]{{1,{places}}})?"
        raise UnsupportedSchema(
            f"'multipleOf' {step} on a number at {path} (supported: 1, and 0.1, 0.01, ... "
            "without bounds)"
        )

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
        patterns = schema.get("patternProperties", {})
        if not isinstance(patterns, dict):
            raise InvalidSchema(f"'patternProperties' must be an object at {path}")

        def schema_of(name: str) -> Any:
            """A named property's schema: listed, or additionalProperties, plus every
            patternProperties entry its name matches."""
            matched = [sub for pattern, sub in patterns.items() if _search(pattern, name, path)]
            base = props[name] if name in props else (True if matched else extra)
            return {"allOf": [base, *matched]} if matched else base

        names = list(props) + [r for r in required if r not in props]
        members = []  # (regex of `"key":value`, required), in schema order
        for name in names:
            value = self.convert(schema_of(name), f"{path}/properties/{name}", depth)
            if value is None:
                if name in required:
                    return None
                continue
            members.append((f"{escape(_dump(name))}{w}:{w}{value}", name in required))
        lo, hi = schema.get("minProperties", 0), schema.get("maxProperties")
        if not members and names:
            # Every listed property is forbidden or cannot be written: only what is left is
            # the empty object (a map here could write a forbidden name).
            return rf"\{{{w}\}}" if lo == 0 else None
        if not members and patterns:
            # Keys written to match a pattern; a key may match several, so each value
            # obeys all of them (stricter when they do not overlap, hence safe).
            subs = list(patterns.values())
            value = self.convert(
                subs[0] if len(subs) == 1 else {"allOf": subs}, f"{path}/patternProperties", depth
            )
            if value is None:
                return rf"\{{{w}\}}" if lo == 0 else None
            keys = [f'"{pattern_regex(p, CHAR, path)}"' for p in patterns]
            member = f"{_alt(keys)}{w}:{w}{value}"
            return _sequence(r"\{", r"\}", member, lo, hi, w, path, "Properties")
        if not members and extra not in (False, None) and extra != {"not": {}}:
            # A map: any keys, each value under additionalProperties.
            value = self.convert(extra, f"{path}/additionalProperties", depth)
            if value is None:
                return rf"\{{{w}\}}" if lo == 0 else None
            member = f"{STRING}{w}:{w}{value}"
            return _sequence(r"\{", r"\}", member, lo, hi, w, path, "Properties")
        num_required = sum(req for _, req in members)
        # minProperties 1 over optional members only: the object is not empty.
        nonempty = lo == 1 and num_required == 0
        if (lo > num_required and not nonempty) or (hi is not None and hi < len(members)):
            raise UnsupportedSchema(f"'minProperties'/'maxProperties' at {path}")
        extra = self.extras(schema) if not patterns and hi is None else None
        if extra is not None:
            # Unlisted properties after the listed ones, each under additionalProperties.
            value = self.convert(extra, f"{path}/additionalProperties", depth)
            if value is not None:
                pair = f'"{_string_not_in(names)}"{w}:{w}{value}'
                members.append((f"{pair}({w},{w}{pair})*", False))
        return rf"\{{{w}{_members(members, w, nonempty)}{w}\}}"

    def extras(self, schema: dict) -> Any:
        """The schema of an object's unlisted properties where we write them, else None."""
        for key in ("additionalProperties", "unevaluatedProperties"):
            if key in schema:
                extra = schema[key]
                return None if extra in (False, None) or extra == {"not": {}} else extra
        return None if self.strict else True

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


def _plain_items(parts: list[dict]) -> bool:
    """Whether every part's items is one schema for all items (no tuple form), so that two
    of them merge into their allOf."""
    return all(isinstance(p.get("items", {}), dict) and "prefixItems" not in p for p in parts)


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


_MISSING = object()


def resolve_pointer(root: Any, ref: str) -> Any:
    """What a local `$ref` ("#/a/b/0") points at in `root`, or _MISSING."""
    target = root
    for part in filter(None, ref.lstrip("#").split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            return _MISSING
    return target


def _search(pattern: str, name: str, path: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except re.error as e:
        raise UnsupportedSchema(f"patternProperties pattern {pattern!r} at {path}: {e}") from None


def _members(members: list[tuple[str, bool]], w: str, nonempty: bool = False) -> str:
    """Members in order, each optional one present or not, commas only between present ones
    (at least one present when `nonempty`).

    Up to the first required member, `head` is "the members written so far, at least one":
    head(k) = (head(k-1) (,m_k)? | m_k). Each member appears twice in it (bare when it is the
    first written, with its comma when not), so the regex and its automaton grow linearly
    with the members; branching on the first present member and repeating the rest after
    each would copy every later member once per earlier one.
    """
    sep = f"{w},{w}"
    head = None  # None: nothing written yet is possible
    rest = len(members)
    for i, (m, req) in enumerate(members):
        if req:
            head = m if head is None else f"({head}{sep}{m}|{m})"
            rest = i + 1
            break
        head = m if head is None else f"({head}({sep}{m})?|{m})"
    else:
        if head is None:
            return ""
        return f"({head})" if nonempty else f"({head})?"  # every member optional
    later = "".join(f"{sep}{m}" if req else f"({sep}{m})?" for m, req in members[rest:])
    return f"{head}{later}"


def _string_not_in(names: list[str]) -> str:
    """The content of a JSON string (a key, a value) that is none of `names`, in plain
    characters: with no escapes, no other spelling of a listed name can slip through."""
    trie: dict = {}
    for name in names:
        if not any(c in '"\\' or ord(c) < 0x20 for c in name):
            node = trie
            for c in name:
                node = node.setdefault(c, {})
            node[None] = {}  # a name ends here

    def below(node: dict) -> str:
        chars = [c for c in node if c is not None]
        options = [] if None in node else [""]
        others = "".join(escape(c) for c in chars)
        options.append(f'[^"\\\\\\x00-\\x1f{others}]{PLAIN_CHAR}*')
        options += [f"{escape(c)}{below(node[c])}" for c in chars]
        return "(" + "|".join(options) + ")"

    return below(trie)


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
    """number_bounds, checked: numbers, and at least one number between them."""
    lo, lo_excl, hi, hi_excl = number_bounds(schema)
    for b in (lo, hi):
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float))):
            raise InvalidSchema(f"numeric bounds must be numbers at {path}")
    if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_excl or hi_excl))):
        raise UnsupportedSchema(f"bounds at {path} admit no number: unsatisfiable")
    return lo, lo_excl, hi, hi_excl


def _integer_bounds(schema: dict, path: str) -> tuple[int | None, int | None]:
    """Inclusive integer bounds."""
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
