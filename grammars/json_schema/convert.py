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
from collections.abc import Callable
from decimal import Decimal
from typing import Any
from urllib.parse import unquote

from braid.grammars.compile.constraint_regex import escape
from braid.grammars.json_schema.arrays import array_regex, merged_items
from braid.grammars.json_schema.errors import InvalidSchema, UnsupportedSchema
from braid.grammars.json_schema.formats import FORMAT_LENGTHS, FORMATS, MISSING_FORMATS
from braid.grammars.json_schema.negation import (
    excluded_values,
    forbidden_names,
    negated_condition,
    required_clauses,
)
from braid.grammars.json_schema.one_of import exclusive_branches
from braid.grammars.json_schema.pattern import pattern_regex
from braid.grammars.json_schema.ranges import integer_regex, number_bounds, number_regex
from braid.grammars.json_schema.refs import local_refs
from braid.grammars.json_schema.unevaluated import without_unevaluated
from braid.grammars.json_schema.values import is_type, is_valid, json_equal

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
# outlines index or the lazy automaton, is grammars/compile/jobs.py's choice.) Patterns and formats
# under length bounds count plain characters only.
PLAIN_CHAR = r'[^"\\\x00-\x1f]'
COUNTED_CHAR = r'([^"\\\x00-\x1f]|\\["\\/bfnrt])'
MAX_STRING_CHARS = 4096
BOOLEAN = "(true|false)"
NULL = "null"

# Keywords that describe and never constrain (identifiers and anchors are read when
# references are, json_schema_refs.py; `nullable` is OpenAPI's, which JSON Schema
# validators ignore: null is written only where `type` allows it).
ANNOTATIONS = {
    "$schema", "$id", "id", "$comment", "title", "description", "default", "examples",
    "example", "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding",
    "contentSchema", "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$vocabulary", "$defs",
    "definitions", "discriminator", "xml", "externalDocs", "nullable",
}  # fmt: skip
# Keywords of one type (they say nothing about values of other types); the array ones are
# json_schema_arrays.py's. unevaluatedProperties and unevaluatedItems are rewritten before
# (json_schema_unevaluated.py).
TYPE_KEYWORDS = {
    "string": {"minLength", "maxLength", "pattern", "format"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "object": {
        "properties", "required", "additionalProperties", "minProperties", "maxProperties",
        "patternProperties", "propertyNames",
    },
    "array": {"items", "prefixItems", "minItems", "maxItems", "additionalItems", "uniqueItems",
              "contains", "minContains", "maxContains"},
    "boolean": set(),
    "null": set(),
}  # fmt: skip
GENERAL = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "not"}
UNEVALUATED = frozenset({"unevaluatedProperties", "unevaluatedItems"})
ALL_TYPES = tuple(TYPE_KEYWORDS)
_TYPED = set().union(*TYPE_KEYWORDS.values())
# Draft 4-7 `dependencies` (both forms) and their 2019-09 names: expanded into anyOf.
DEPENDENCIES = ("dependencies", "dependentRequired", "dependentSchemas")
MAX_DEPENDENCIES = 4  # each one doubles the alternatives
CONDITIONAL = ("if", "then", "else")
_CONSTRAINING = GENERAL | _TYPED | set(DEPENDENCIES) | {"if"}
_KEYED = ("properties", "patternProperties")  # name -> schema maps, merged by name
_ITEMS = ("items", "prefixItems", "additionalItems")  # merged by json_schema_arrays


def schema_to_regex(
    schema: dict[str, Any] | bool, whitespace: str | None = None, strict: bool = True
) -> str:
    too_large = None
    schema = local_refs(schema)
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


def _schema_ids(root: Any) -> set[int]:
    """The ids of every object in a document."""
    ids, stack = set(), [root]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ids.add(id(node))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return ids


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
        # The document's own subschemas (alive as long as the converter, so their ids are
        # theirs alone) -> their regex at each depth: a definition that many $refs name is
        # converted once per depth, not once per reference.
        self.document = _schema_ids(root)
        self.converted: dict[tuple[int, int], str | None] = {}

    # ---- dispatch --------------------------------------------------------------------

    def convert(self, schema: Any, path: str, depth: int) -> str | None:
        key = (id(schema), depth)
        if key in self.converted:
            return self.converted[key]
        regex = self._convert(schema, path, depth)
        if regex is not None and len(regex) > MAX_REGEX_CHARS:
            raise _TooLarge(f"the schema's regex is too large at {path}")
        if key[0] in self.document:
            self.converted[key] = regex
        return regex

    def _convert(self, schema: Any, path: str, depth: int) -> str | None:
        if schema is True or schema == {}:
            return self.any_value(2)
        if schema is False:
            return None
        if not isinstance(schema, dict):
            raise InvalidSchema(f"a schema must be an object or a boolean at {path}")
        if schema.keys() & UNEVALUATED:
            return self.convert(without_unevaluated(schema, self.resolver(path)), path, depth)
        if "if" in schema and not schema.keys() & {"then", "else"}:
            schema = {k: v for k, v in schema.items() if k != "if"}  # a condition alone: no-op
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
        if not schema.keys() & _CONSTRAINING:
            return self.any_value(2)  # only annotations: any value
        types = self.types(schema, path)
        options = [getattr(self, t)(schema, path, depth) for t in types]
        return _alt(options)

    def types(self, schema: dict, path: str) -> list[str]:
        """The types to write: declared (or inferred), less those `not` names; a number
        that must not be an integer is a "fraction"."""
        types = self.declared_types(schema, path)
        if "not" in schema:  # only `not` of types is a regex: drop those types
            gone = self.excluded_types(schema["not"], path)
            types = [t for t in types if t not in gone and (t != "integer" or "number" not in gone)]
            if "integer" in gone:
                types = ["fraction" if t == "number" else t for t in types]
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
        if "integer" in types and "number" in types:
            types = [t for t in types if t != "integer"]
        return types

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
        tuples = sum(bool(p.keys() & {"items", "prefixItems"}) for p in parts) > 1
        if tuples:  # item schemas merged position by position
            merged.update(merged_items(parts))
        for part in parts:
            for key, value in part.items():
                if key not in _CONSTRAINING or (tuples and key in _ITEMS):
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
                elif key == "propertyNames":
                    merged[key] = {"allOf": [merged[key], value]}
                elif key == "uniqueItems":
                    merged[key] = merged[key] is True or value is True
                elif key == "anyOf" and len(merged[key]) * len(value) <= 64:
                    merged[key] = [{"allOf": [x, y]} for x in merged[key] for y in value]
                elif key in ("enum", "const"):
                    checks.append({key: value})
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
        if schema.keys() & UNEVALUATED:
            schema = without_unevaluated(schema, self.resolver(path))
        if "if" in schema and not schema.keys() & {"then", "else"}:
            schema = {k: v for k, v in schema.items() if k != "if"}
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
                        f"'allOf' at {path}: additionalProperties (or unevaluatedProperties) "
                        "with a schema meets another part's properties"
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

    def resolver(self, path: str) -> Callable[[str], Any]:
        return lambda ref: self.resolve(ref, path)

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
        extra = schema.get("additionalProperties", True)
        patterns = schema.get("patternProperties", {})
        if not isinstance(patterns, dict):
            raise InvalidSchema(f"'patternProperties' must be an object at {path}")
        names_schema = schema.get("propertyNames", True)
        if names_schema is not True and names_schema != {}:
            return self.named_object(schema, names_schema, path, depth)

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
            return self.map(_alt(keys), value, lo, hi, path)
        if not members and extra not in (False, None) and extra != {"not": {}}:
            # A map: any keys, each value under additionalProperties.
            value = self.convert(extra, f"{path}/additionalProperties", depth)
            if value is None:
                return rf"\{{{w}\}}" if lo == 0 else None
            return self.map(STRING, value, lo, hi, path)
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

    def map(self, key: str, value: str, lo: int, hi: int | None, path: str) -> str:
        """An object of lo to hi members, each a key matching `key` (a string's regex) and a
        value matching `value`. A regex cannot keep keys apart, and a validator keeps one
        member of each repeated key, so more than one member cannot be required."""
        if lo > 1:
            raise UnsupportedSchema(
                f"'minProperties' {lo} at {path} on an object whose keys are not listed (a "
                "regex cannot keep its keys distinct)"
            )
        if hi is not None:
            hi = min(hi, MAX_REPEAT)  # larger objects are not written: stricter
        member = f"{key}{self.ws}:{self.ws}{value}"
        return _sequence(r"\{", r"\}", member, lo, hi, self.ws, path, "Properties")

    def named_object(self, schema: dict, names_schema: Any, path: str, depth: int) -> str | None:
        """An object whose keys obey `propertyNames`. Listed names that break it are not
        written; finitely many names (enum, const) become listed properties; otherwise the
        keys of a map are strings under it, and unlisted properties beside listed ones are
        not written (stricter)."""
        rest = {k: v for k, v in schema.items() if k != "propertyNames"}
        props, required = dict(rest.get("properties", {})), rest.get("required", [])
        allowed = self.key_check(names_schema, path)
        for name in [*props, *required]:
            if not allowed(name):
                if name in required:
                    return None
                props[name] = False
        finite = _finite_names(names_schema)
        if finite is not None:
            unlisted = rest.get("additionalProperties", True) if not props else self.extras(rest)
            if unlisted is not None:
                patterns = rest.get("patternProperties", {})
                for name in finite:
                    if name not in props and allowed(name):
                        matched = [s for p, s in patterns.items() if _search(p, name, path)]
                        props[name] = {"allOf": [unlisted, *matched]} if matched else unlisted
            closed = {"properties": props, "additionalProperties": False}
            others = {k: v for k, v in rest.items() if k != "patternProperties"}
            return self.object({**others, **closed}, path, depth)
        if props or required:
            return self.object(
                {**rest, "properties": props, "additionalProperties": False}, path, depth
            )
        if rest.get("patternProperties"):
            raise UnsupportedSchema(
                f"'propertyNames' beside 'patternProperties' at {path} (supported: names "
                "listed, an enum or const of names, or the keys of an additionalProperties map)"
            )
        extra = rest.get("additionalProperties", True)
        lo, hi = rest.get("minProperties", 0), rest.get("maxProperties")
        value = (
            None if extra is False else self.convert(extra, f"{path}/additionalProperties", depth)
        )
        key = self.convert(
            {"allOf": [names_schema, {"type": "string"}]}, f"{path}/propertyNames", depth
        )
        if value is None or key is None:
            return rf"\{{{self.ws}\}}" if lo == 0 else None
        return self.map(key, value, lo, hi, path)

    def key_check(self, names_schema: Any, path: str) -> Callable[[str], bool]:
        def allowed(name: str) -> bool:
            try:
                return is_valid(name, names_schema, self.resolver(path))
            except UnsupportedSchema as e:
                raise UnsupportedSchema(f"'propertyNames' at {path}: {e}") from None

        return allowed

    def extras(self, schema: dict) -> Any:
        """The schema of an object's unlisted properties where we write them, else None."""
        if "additionalProperties" in schema:
            extra = schema["additionalProperties"]
            return None if extra in (False, None) or extra == {"not": {}} else extra
        return None if self.strict else True

    def array(self, schema: dict, path: str, depth: int) -> str | None:
        _check_bound(
            schema.get("minItems", 0), schema.get("maxItems"), "minItems", "maxItems", path
        )
        return array_regex(self, schema, path, depth)

    def fraction(self, schema: dict, path: str, depth: int) -> str | None:
        """A number that is not an integer (`not` of integer). A validator reads the JSON
        number as a binary float, so 1.00000000000000001 is the integer 1: the digits are
        kept within a float's precision (6 before the point, 8 after: stricter, safe)."""
        if schema.keys() & {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                            "multipleOf"}:  # fmt: skip
            raise UnsupportedSchema(
                f"'not' of integer beside number bounds at {path} (supported without bounds)"
            )
        return r"-?(0|[1-9][0-9]{0,5})\.[0-9]{0,7}[1-9]"

    def dump(self, value: Any) -> str:
        return _dump(value)

    def members(self, members: list[tuple[str, bool]], nonempty: bool) -> str:
        return _members(members, self.ws, nonempty)


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
    for part in filter(None, unquote(ref.lstrip("#")).split("/")):
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


def _finite_names(names_schema: Any) -> list[str] | None:
    """The names a propertyNames schema lists (enum, const), if it lists them."""
    if isinstance(names_schema, dict):
        listed = [names_schema["const"]] if "const" in names_schema else names_schema.get("enum")
        if isinstance(listed, list):
            return [n for n in listed if isinstance(n, str)]
    return None


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
