"""What keeps a schema's regex small, and where it goes when it is not: optional properties
in linear size; long counted strings kept whole and compiled by the lazy automaton instead of
an index; $ref depth lowered past MAX_REGEX_CHARS, which is stricter than the schema, never
looser: what the regex matches must still validate."""

from __future__ import annotations

import itertools
import json
import re

import jsonschema
import pytest

from braid import grammars
from braid.grammars.json_schema import convert as json_schema
from braid.grammars.json_schema.convert import schema_to_regex
from braid.grammars.json_schema.objects import members_regex
from braid.grammars.regex.lazy import LazyRegexGrammar
from braid.grammars.regex.outlines_index import fits_index


@pytest.mark.parametrize("size", range(6))
def test_members_are_every_ordered_subset_with_required_ones(size):
    for required in itertools.product([False, True], repeat=size):
        members = [(f"m{i}", req) for i, req in enumerate(required)]
        regex = re.compile(members_regex(members, ","))
        for present in itertools.product([False, True], repeat=size):
            text = ",".join(f"m{i}" for i in range(size) if present[i])
            allowed = all(p or not r for p, r in zip(present, required, strict=True))
            assert bool(regex.fullmatch(text)) == allowed, (required, text)
        for bad in (",m0", "m0,", "m0,,m1", "m1,m0"):
            assert not regex.fullmatch(bad)


def test_optional_members_grow_linearly():
    def length(n: int) -> int:
        props = {f"p{i}": {"type": "string", "format": "date"} for i in range(n)}
        return len(schema_to_regex({"type": "object", "properties": props}))

    # Each member twice (first written, or after a comma): twice the members, twice the size.
    assert length(80) < 2.2 * length(40)


def test_long_strings_keep_their_length_under_the_lazy_automaton(vocab, feeds):
    props = {f"field{i}": {"type": "string", "maxLength": 255} for i in range(8)}
    schema = {"type": "object", "properties": props, "required": list(props)}
    regex = schema_to_regex(schema)
    assert not fits_index(regex)  # 8 x 255 counted characters: too many states for an index
    grammar = grammars.compile(grammars.JsonSchema.of(schema), vocab)
    assert isinstance(grammar, LazyRegexGrammar)
    longest = {name: "x" * 255 for name in props}
    assert feeds(grammar, json.dumps(longest, separators=(",", ":")))
    too_long = {**longest, "field7": "x" * 256}
    assert not feeds(grammar, json.dumps(too_long, separators=(",", ":")))
    # An escape is one character of the count, however many bytes it takes.
    escaped = {**longest, "field0": 'q"\n' * 85}
    assert feeds(grammar, json.dumps(escaped, separators=(",", ":")))
    escaped["field0"] += "x"
    assert not feeds(grammar, json.dumps(escaped, separators=(",", ":")))
    # A long string costs a few masks, not one per character: masks are shared by states
    # that need and allow as many more characters as the longest token can take.
    assert grammar.stats()["masks"] < 8 * 255 // 4


def test_huge_recursive_schema_compiles_shallower(monkeypatch):
    monkeypatch.setattr(json_schema, "MAX_REGEX_CHARS", 100_000)
    props = {f"attr{i}": {"type": "string", "format": "date-time"} for i in range(30)}
    props["children"] = {"type": "array", "items": {"$ref": "#"}}
    schema = {"type": "object", "properties": props, "required": ["attr0"]}
    regex = schema_to_regex(schema)
    assert len(regex) <= 100_000
    leaf = {"attr0": "2024-01-02T03:04:05Z"}
    nested = {**leaf, "children": [{**leaf, "children": [leaf]}]}
    jsonschema.validate(nested, schema)
    assert re.fullmatch(regex, json.dumps(nested, separators=(",", ":")))
    with pytest.raises(json_schema.UnsupportedSchema, match="too large"):
        json_schema._Converter(schema, "").convert(schema, "#", 0)  # the full depth


def test_a_web_of_definitions_too_large_whole_counts_every_ref(monkeypatch):
    """Definitions that name each other without recursion are followed to their ends; where
    that is too large at every depth, each $ref counts as recursion would: the regex is cut
    at MIN_DEPTH..MAX_DEPTH levels of $refs, and what it keeps still validates."""
    monkeypatch.setattr(json_schema, "MAX_REGEX_CHARS", 100_000)
    defs = {
        f"d{i}": {
            "type": "object",
            "properties": {"n": {"type": "integer"}}
            | {k: {"$ref": f"#/$defs/d{i + 1}"} for k in "abc"},
            "required": ["n"],
        }
        for i in range(12)
    }
    defs["d12"] = {"type": "integer"}
    schema = {"$defs": defs, "$ref": "#/$defs/d0"}
    with pytest.raises(json_schema.UnsupportedSchema, match="too large"):
        json_schema._Converter(schema, "").convert(schema, "#", 0)  # every definition whole
    regex = schema_to_regex(schema)
    assert len(regex) <= 100_000
    shallow = {"n": 1, "a": {"n": 2, "c": {"n": 3}}}
    jsonschema.validate(shallow, schema)
    assert re.fullmatch(regex, json.dumps(shallow))
    deep = {"n": 0}
    for i in range(1, 6):
        deep = {"n": i, "b": deep}
    jsonschema.validate(deep, schema)
    assert not re.fullmatch(regex, json.dumps(deep))  # cut: stricter than the schema, never looser
