"""JSON Schema -> regex, exact or refused.

The regex matches JSON text of valid instances, with the given whitespace between tokens
and around the document (none: compact) and properties in the schema's order. The rule that keeps
generation safe: every text the regex matches must be valid under the schema. Being
stricter than the schema is allowed (the model just cannot write some valid documents,
e.g. extra properties or `1.0` for an integer); being looser is a bug. A keyword that
cannot be enforced exactly raises UnsupportedSchema naming it, never silently dropped.
Keywords the spec does not define (`x-...`, `javaType`, typos) are annotations and ignored,
as validators ignore them.

Inside, a schema converts to a regex string, or to None when it admits no instance we can
write (an unsatisfiable branch, or $refs past the depth limit): callers drop such options.
This module dispatches on the keywords; each keyword family has its module beside it
(objects.py, strings.py, numbers.py, arrays.py, all_of.py, one_of.py, conditional.py, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from braid.grammars.compiling.constraint_regex import escape
from braid.grammars.constraints import JSON_WHITESPACE
from braid.grammars.json_schema.all_of import all_of_regex
from braid.grammars.json_schema.arrays import array_regex
from braid.grammars.json_schema.conditional import unconditional, without_dependencies
from braid.grammars.json_schema.errors import InvalidSchema, UnsupportedSchema
from braid.grammars.json_schema.formats import FORMATS, MISSING_FORMATS
from braid.grammars.json_schema.json_text import BOOLEAN, NULL, STRING, alternatives, compact_json
from braid.grammars.json_schema.keywords import (
    ALL_TYPES,
    ANNOTATIONS,
    CONSTRAINING,
    DEPENDENCIES,
    TYPE_KEYWORDS,
    UNEVALUATED,
    check_bound,
)
from braid.grammars.json_schema.negation import excluded_values, forbidden_names, required_clauses
from braid.grammars.json_schema.numbers import bounded_number, integer_except, non_integer
from braid.grammars.json_schema.objects import members_regex, object_regex
from braid.grammars.json_schema.one_of import exclusive_branches
from braid.grammars.json_schema.ranges import number_regex
from braid.grammars.json_schema.refs import local_refs, recursive_refs
from braid.grammars.json_schema.strings import string_not_in, string_regex
from braid.grammars.json_schema.unevaluated import without_unevaluated
from braid.grammars.json_schema.values import is_type, is_valid, json_equal

# Recursive $refs (on a cycle) are followed this deep (recursion unrolls); deeper instances
# cannot be generated. A chain of distinct definitions (nested models) is followed to its
# end. A regex past MAX_REGEX_CHARS is converted again one level shallower (down to
# MIN_DEPTH), then with every $ref counted as recursion is.
MAX_DEPTH = 4
MIN_DEPTH = 2
MAX_REGEX_CHARS = 4_000_000  # past this the lazy automaton's NFA nears its 8M-node limit
# Subschemas converted inside one another, $refs followed included: conversion recurses per
# level, and a chain of definitions nesting deeper than this is hostile (nested models nest
# a few levels, each two here) rather than real; it is refused before Python's stack ends.
MAX_NESTING = 160


def schema_to_regex(
    schema: dict[str, Any] | bool,
    whitespace: str = JSON_WHITESPACE,
    strict: bool = True,
    separators: tuple[str, str] | None = None,
    around: bool = True,
) -> str:
    """The regex of the schema's instances as JSON text, with `whitespace` between tokens
    and, with `around`, around the document ("": compact; a document inside a fixed
    wrapper, as a tool call's arguments, goes without `around`);
    `strict`: unlisted properties only where additionalProperties allows them explicitly;
    `separators`: the texts between items and between a key and its value (their commas
    and colons included), in place of whitespace around them.
    Raises UnsupportedSchema (a keyword it cannot enforce) or InvalidSchema."""
    too_large = None
    schema = local_refs(schema)
    # Too large at every depth: converted again with every $ref counted toward the depth, so
    # a web of definitions referring to each other (not recursion) is cut as recursion is.
    for every_ref_counts in (False, True):
        for depth in range(MAX_DEPTH, MIN_DEPTH - 1, -1):
            conv = _Converter(schema, whitespace, depth, strict, separators, every_ref_counts)
            try:
                regex = conv.convert(schema, "#", 0)
            except _TooLarge as e:
                too_large = too_large or e
                if not (every_ref_counts or conv.recursive):
                    break  # the depth bounds only recursion, and there is none
                continue
            if regex is None:
                raise too_large or UnsupportedSchema(
                    "the schema admits no instance that can be generated"
                )
            # json.loads takes whitespace around the document; models often end with a newline.
            return f"{whitespace}({regex}){whitespace}" if whitespace and around else regex
    raise too_large


class _TooLarge(UnsupportedSchema):
    pass


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


class _Converter:
    """One conversion (a root, whitespace, a depth): the dispatch on keywords, and what the
    keyword modules, handed it as `conv`, call back: convert, declared_types, deref, resolve,
    resolver, extras, literal, members, and the fields ws, item_sep, key_sep and max_depth."""

    def __init__(
        self,
        root: dict | bool,
        ws: str,
        depth: int = MAX_DEPTH,
        strict: bool = True,
        separators: tuple[str, str] | None = None,
        every_ref_counts: bool = False,
    ) -> None:
        self.root = root
        self.ws = ws
        # Between two items or members, and between a key and its value.
        item, key = separators or (None, None)
        self.item_sep = f"{ws},{ws}" if item is None else escape(item)
        self.key_sep = f"{ws}:{ws}" if key is None else escape(key)
        self.strict = strict  # unlisted properties only where additionalProperties says so
        self.max_depth = depth  # recursive $refs followed (every $ref, with every_ref_counts)
        self.every_ref_counts = every_ref_counts
        self.recursive = recursive_refs(root, lambda ref: _found(resolve_pointer(root, ref)))
        # The document's own subschemas (alive as long as the converter, so their ids are
        # theirs alone) -> their regex at each depth: a definition that many $refs name is
        # converted once per depth, not once per reference.
        self.document = _schema_ids(root)
        self.converted: dict[tuple[int, int], str | None] = {}
        self.nesting = 0  # convert() calls open

    # ---- dispatch --------------------------------------------------------------------

    def convert(self, schema: Any, path: str, depth: int) -> str | None:
        key = (id(schema), depth)
        if key in self.converted:
            return self.converted[key]
        if self.nesting >= MAX_NESTING:
            raise UnsupportedSchema(
                f"the schema nests subschemas more than {MAX_NESTING} deep at {path} "
                "(the $refs followed counted)"
            )
        self.nesting += 1
        try:
            regex = self._convert(schema, path, depth)
        finally:
            self.nesting -= 1
        if regex is not None:
            self.check_size(len(regex), path)
        if key[0] in self.document:
            self.converted[key] = regex
        return regex

    def check_size(self, chars: int, path: str) -> None:
        """Refuse (for a shallower conversion) a regex of `chars` characters at `path`."""
        if chars > MAX_REGEX_CHARS:
            raise _TooLarge(f"the schema's regex is too large at {path}")

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
            return self.convert(unconditional(self, schema, path), path, depth)
        if "$ref" in schema:
            rest = {k: v for k, v in schema.items() if k in CONSTRAINING and k != "$ref"}
            if rest:  # siblings of $ref apply too (2019-09; stricter than draft 7, so safe)
                return all_of_regex(self, {"allOf": [{"$ref": schema["$ref"]}, rest]}, path, depth)
            return self.ref(schema, path, depth)
        if "not" in schema and (clauses := required_clauses(schema["not"])) is not None:
            rest = {k: v for k, v in schema.items() if k != "not"}
            names = forbidden_names(clauses, rest.get("required"))
            gone = {"properties": {name: False for name in names}}
            return self.convert({"allOf": [rest, gone]}, path, depth)
        if schema.keys() & set(DEPENDENCIES):
            return self.convert(without_dependencies(schema, path), path, depth)
        if "allOf" in schema:
            return all_of_regex(self, schema, path, depth)
        if "anyOf" in schema:
            return alternatives(self.branches(schema, "anyOf", path, depth))
        if "oneOf" in schema:
            return self.one_of(schema, path, depth)
        if "not" in schema and (excluded := excluded_values(schema["not"])) is not None:
            return self.without_values(schema, *excluded, path, depth)
        if not schema.keys() & CONSTRAINING:
            return self.any_value(2)  # only annotations: any value
        types = self.types(schema, path)
        return alternatives([self.typed(t, schema, path, depth) for t in types])

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

    def ref(self, schema: dict, path: str, depth: int) -> str | None:
        ref = schema["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise UnsupportedSchema(f"only local '$ref's (#/...) are supported, got {ref!r}")
        deeper = self.follow(ref, depth)
        if deeper is None:
            return None  # recursion this deep is not generated
        return self.convert(self.resolve(ref, path), ref, deeper)

    def follow(self, ref: str, depth: int) -> int | None:
        """The depth past a $ref at `depth`: one deeper where it is recursion (or every
        $ref counts), the same where it is not; None where that is past max_depth."""
        if ref not in self.recursive and not self.every_ref_counts:
            return depth
        return depth + 1 if depth < self.max_depth else None

    def one_of(self, schema: dict, path: str, depth: int) -> str | None:
        subs = schema["oneOf"]
        if not isinstance(subs, list) or not subs:
            raise InvalidSchema(f"'oneOf' must be a non-empty list at {path}")
        rest = {k: v for k, v in schema.items() if k != "oneOf"}
        subs = exclusive_branches(subs, rest, self, path, depth)
        return alternatives(self.branches({**schema, "oneOf": subs}, "oneOf", path, depth))

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
                options.append(self.typed(t, rest, path, depth))
            elif t == "boolean":
                left = [b for b in (True, False) if not any(json_equal(b, v) for v in hit)]
                options.append(alternatives([compact_json(b) for b in left]))
            elif t == "string" and not rest.keys() & TYPE_KEYWORDS["string"]:
                options.append(f'"{string_not_in(hit)}"')
            elif t == "integer":
                options.append(integer_except(rest, hit, path))
            elif t != "null":
                raise UnsupportedSchema(
                    f"keyword 'not' at {path} excludes a {t} value (values are excluded "
                    "from plain strings, integers, booleans and null)"
                )
        return alternatives(options)

    def may_write(self, value: Any, schema: dict, t: str, path: str) -> bool:
        """Whether `value` is valid under the schema's keywords for type t (True when they
        cannot be checked: the value is then excluded, stricter and so safe)."""
        try:
            return is_valid(value, {**schema, "type": t}, lambda ref: self.resolve(ref, path))
        except UnsupportedSchema:
            return True

    # ---- references ------------------------------------------------------------------

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

    # ---- values ----------------------------------------------------------------------

    def values(self, values: list, key: str, schema: dict, path: str) -> str | None:
        """A finite set: the values also valid under the schema's other keywords."""
        rest = {k: v for k, v in schema.items() if k != key}
        kept = [v for v in values if is_valid(v, rest, lambda ref: self.resolve(ref, path))]
        if not kept:
            return None
        return alternatives([self.literal(v) for v in kept])

    def any_value(self, depth: int) -> str:
        """Any JSON value nested at most `depth` containers deep."""
        scalar = f"({STRING}|{number_regex(None, None, False, False)}|{BOOLEAN}|{NULL})"
        value = scalar
        w = self.ws
        for _ in range(depth):
            array = rf"\[{w}({value}({self.item_sep}{value})*)?{w}\]"
            member = f"{STRING}{self.key_sep}{value}"
            obj = rf"\{{{w}({member}({self.item_sep}{member})*)?{w}\}}"
            value = f"({scalar}|{array}|{obj})"
        return value

    def typed(self, t: str, schema: dict, path: str, depth: int) -> str | None:
        """The schema's values of one type (a "fraction" is a number that is not an
        integer); each type's keywords are its module's."""
        match t:
            case "string":
                return string_regex(schema, path)
            case "integer":
                return integer_except(schema, [], path)
            case "number":
                return bounded_number(schema, path)
            case "fraction":
                return non_integer(schema, path)
            case "boolean":
                return BOOLEAN
            case "null":
                return NULL
            case "object":
                return object_regex(self, schema, path, depth)
            case "array":
                lo, hi = schema.get("minItems", 0), schema.get("maxItems")
                check_bound(lo, hi, "minItems", "maxItems", path)
                return array_regex(self, schema, path, depth)
        raise AssertionError(f"no type {t!r}")

    # ---- what the keyword modules ask of the converter ---------------------------------

    def extras(self, schema: dict) -> Any:
        """The schema of an object's unlisted properties where we write them, else None."""
        if "additionalProperties" in schema:
            extra = schema["additionalProperties"]
            return None if extra in (False, None) or extra == {"not": {}} else extra
        return None if self.strict else True

    def literal(self, value: Any) -> str:
        """The regex of one value's JSON text, whitespace and separators as everywhere else.
        An object's members stay in the order written: const and enum name their values
        as JSON, and a model copying one writes it in that order (another order is equal
        under the spec, so not writing it is stricter, and safe)."""
        w = self.ws
        if isinstance(value, list):
            items = self.item_sep.join(self.literal(v) for v in value)
            return rf"\[{w}{items}{w}\]" if value else rf"\[{w}\]"
        if isinstance(value, dict):
            key = self.key_sep
            members = self.item_sep.join(
                f"{escape(compact_json(k))}{key}{self.literal(v)}" for k, v in value.items()
            )
            return rf"\{{{w}{members}{w}\}}" if value else rf"\{{{w}\}}"
        return escape(compact_json(value))

    def members(self, members: list[tuple[str, bool]], nonempty: bool) -> str:
        return members_regex(members, self.item_sep, nonempty)


_MISSING = object()


def _found(target: Any) -> Any:
    return None if target is _MISSING else target


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
