"""What keeps a schema's regex (and so its outlines index) small enough to build: optional
properties in linear size, long counted strings cut when a schema has many, $ref depth
lowered for huge schemas. Each cut is stricter than the schema, never looser: what the
regex matches must still validate."""

from __future__ import annotations

import itertools
import json
import re

import jsonschema
import pytest

from grammars import json_schema
from grammars.json_schema import _members, schema_to_regex


@pytest.mark.parametrize("size", range(6))
def test_members_are_every_ordered_subset_with_required_ones(size):
    for required in itertools.product([False, True], repeat=size):
        members = [(f"m{i}", req) for i, req in enumerate(required)]
        regex = re.compile(_members(members, ""))
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


def test_many_long_strings_are_cut_and_stay_valid():
    props = {f"field{i}": {"type": "string", "maxLength": 255} for i in range(8)}
    schema = {"type": "object", "properties": props, "required": list(props)}
    regex = schema_to_regex(schema)
    counted = sum(int(hi) for hi in json_schema._COUNTED.findall(regex))
    assert counted <= json_schema.COUNTED_BUDGET
    short = {name: "x" * 20 for name in props}
    assert re.fullmatch(regex, json.dumps(short, separators=(",", ":")))
    longer = {name: "x" * 200 for name in props}  # valid, but past the cut: refused
    jsonschema.validate(longer, schema)
    assert not re.fullmatch(regex, json.dumps(longer, separators=(",", ":")))
    # One long string alone keeps its whole length.
    one = schema_to_regex({"type": "string", "maxLength": 255})
    assert re.fullmatch(one, json.dumps("y" * 255))


def test_huge_recursive_schema_compiles_shallower():
    props = {f"attr{i}": {"type": "string", "format": "date-time"} for i in range(30)}
    props["children"] = {"type": "array", "items": {"$ref": "#"}}
    schema = {"type": "object", "properties": props, "required": ["attr0"]}
    regex = schema_to_regex(schema)
    assert len(regex) <= json_schema.REGEX_BUDGET
    leaf = {"attr0": "2024-01-02T03:04:05Z"}
    nested = {**leaf, "children": [{**leaf, "children": [leaf]}]}
    jsonschema.validate(nested, schema)
    assert re.fullmatch(regex, json.dumps(nested, separators=(",", ":")))
    full = json_schema._Converter(schema, "").convert(schema, "#", 0)
    assert len(full) > json_schema.REGEX_BUDGET  # what the shallower conversion avoided
