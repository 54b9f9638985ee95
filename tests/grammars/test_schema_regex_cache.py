"""JSON schemas that recur across constraints (a tool in several tool sets, a schema inside
structural tags) are converted once per process, within the cache's budget."""

from __future__ import annotations

import json

import braid.grammars.json_schema.convert as convert
from braid.grammars.compiling import constraint_regex as cr
from braid.grammars.constraints import JsonSchema, ToolCalls, ToolSchema


def _tool(name: str, n: int) -> ToolSchema:
    schema = {"type": "object", "properties": {f"p{n}": {"type": "integer"}}}
    return ToolSchema.of(name, schema, f"tools[{n}]")


def test_a_tool_shared_by_two_tool_sets_is_converted_once(monkeypatch):
    monkeypatch.setattr(cr, "_SCHEMA_REGEXES", cr._RegexCache(1 << 20))
    converted = []
    real = convert.schema_to_regex

    def counting(schema, *args):
        converted.append(schema)
        return real(schema, *args)

    monkeypatch.setattr(convert, "schema_to_regex", counting)
    weather, time_, news = _tool("weather", 1), _tool("time", 2), _tool("news", 3)
    first = cr.constraint_regex(ToolCalls((weather, time_)))
    assert len(converted) == 2
    second = cr.constraint_regex(ToolCalls((weather, news)))
    assert [s["properties"] for s in converted[2:]] == [{"p3": {"type": "integer"}}]
    # The shared tool's arguments are the same text in both.
    arguments = real(json.loads(weather.parameters), around=False)
    assert arguments in first and arguments in second


def test_the_cache_keeps_the_last_used_within_its_budget():
    cache = cr._RegexCache(10)
    a, b, c = (JsonSchema.of({"const": n}) for n in range(3))
    cache.put(a, "aaaa")
    cache.put(b, "bbbb")
    assert cache.get(a) == "aaaa"  # a used last: b goes first
    cache.put(c, "cccc")
    assert cache.get(b) is None and cache.get(a) == "aaaa" and cache.get(c) == "cccc"
    cache.put(b, "x" * 11)  # past the whole budget: not kept
    assert cache.get(b) is None


def test_a_cached_regex_is_the_fresh_one(monkeypatch):
    monkeypatch.setattr(cr, "_SCHEMA_REGEXES", cr._RegexCache(1 << 20))
    schema = JsonSchema.of({"type": "array", "items": {"type": "string", "maxLength": 3}})
    assert cr.constraint_regex(schema) is cr.constraint_regex(schema)
    assert cr.constraint_regex(schema) == convert.schema_to_regex(
        {"type": "array", "items": {"type": "string", "maxLength": 3}}
    )
