"""unevaluatedProperties and unevaluatedItems, rewritten into keywords the converter merges.

`unevaluatedProperties: U` constrains the properties that no subschema evaluated: none of
`properties`, `patternProperties`, `additionalProperties` (or a nested unevaluated keyword)
of the schema itself, of its allOf parts and $refs, and of the subschemas that apply
conditionally (anyOf, oneOf, if/then/else, dependentSchemas) where they hold. The parts that
always apply are known statically: the names they list are surely evaluated. So the
keyword becomes one more allOf part, `{"properties": {those names: true},
"patternProperties": {their patterns: true}, "additionalProperties": U}`: it constrains
every property outside the surely evaluated ones, a superset of the unevaluated ones, which
is stricter than the keyword and so safe. (A property listed only in an anyOf branch is then
never written under `unevaluatedProperties: false`.) Where a part that always applies has
`additionalProperties`, every property is evaluated and the keyword constrains nothing.

`unevaluatedItems: U` likewise: the items past the longest `prefixItems` (or tuple `items`)
of the parts that always apply are under `items: U`, unless such a part has `items` for all
items, which evaluates every item. (Items a `contains` matched are evaluated too; leaving
them out is stricter.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_MAX_PARTS = 256  # allOf parts and $refs followed; past this the schema is left as it is


def without_unevaluated(schema: dict, resolve: Callable[[str], Any]) -> dict:
    """`schema` with its unevaluated* keywords rewritten as allOf parts (see above)."""
    closing: list[dict] = []
    rest = {
        k: v for k, v in schema.items() if k not in ("unevaluatedProperties", "unevaluatedItems")
    }
    parts = _static_parts(rest, resolve)
    extra = schema.get("unevaluatedProperties", True)
    if not _trivial(extra) and not any(_all_properties_evaluated(p) for p in parts):
        listed: dict[str, bool] = {}
        patterns: dict[str, bool] = {}
        for part in parts:
            for key, names in (("properties", listed), ("patternProperties", patterns)):
                if isinstance(part.get(key), dict):
                    names.update(dict.fromkeys(part[key], True))
        close = {"properties": listed, "additionalProperties": extra}
        closing.append({**close, "patternProperties": patterns} if patterns else close)
    items = schema.get("unevaluatedItems", True)
    if not _trivial(items) and not any(_all_items_evaluated(p) for p in parts):
        prefix = max((len(_prefix(p)) for p in parts), default=0)
        closing.append(
            {"prefixItems": [True] * prefix, "items": items} if prefix else {"items": items}
        )
    return {"allOf": [rest, *closing]} if closing else rest


def _trivial(schema: Any) -> bool:
    return schema is True or schema == {}


def _static_parts(schema: dict, resolve: Callable[[str], Any]) -> list[dict]:
    """The schema and the subschemas that always apply to the same instance: allOf parts
    and $ref targets, recursively."""
    parts, stack, seen = [], [schema], set()
    while stack and len(parts) < _MAX_PARTS:
        part = stack.pop()
        if not isinstance(part, dict) or id(part) in seen:
            continue
        seen.add(id(part))
        parts.append(part)
        if isinstance(part.get("$ref"), str):
            stack.append(resolve(part["$ref"]))
        if isinstance(part.get("allOf"), list):
            stack.extend(part["allOf"])
    return parts


def _all_properties_evaluated(part: dict) -> bool:
    return "additionalProperties" in part or "unevaluatedProperties" in part


def _all_items_evaluated(part: dict) -> bool:
    items = part.get("items")
    if "unevaluatedItems" in part or (items is not None and not isinstance(items, list)):
        return True
    return isinstance(items, list) and "additionalItems" in part


def _prefix(part: dict) -> list:
    items = part.get("items")
    if isinstance(items, list):
        return items
    prefix = part.get("prefixItems")
    return prefix if isinstance(prefix, list) else []
