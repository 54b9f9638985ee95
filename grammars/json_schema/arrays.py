"""Arrays: tuples (prefixItems, or draft 4-7 `items` lists) followed by more items, `contains`
with minContains/maxContains, and `uniqueItems` over finitely many values.

A regex cannot compare two items, so uniqueItems is written exactly only where the items
are finitely many values (enum, const, booleans, null): every sequence of distinct values,
as a trie of the sequences while that stays small, else the values in their schema's order
(stricter, and linear in size). `contains` is exact where the array's length is not bounded
beyond it (the matching items anywhere); with minItems/maxItems, the matching items come
first (stricter). With maxContains, the other items are written from `not` of the contains
schema, so they cannot match it.
"""

from __future__ import annotations

from math import perm
from typing import Any

from braid.grammars.json_schema.errors import InvalidSchema, UnsupportedSchema
from braid.grammars.json_schema.values import is_valid, json_equal

MAX_UNIQUE_SEQUENCES = 4096  # trie nodes of distinct-value sequences written out
MAX_PREFIX = 512  # tuple positions (each nests one group in the regex)
MAX_ITEMS = 2048  # counted items: a longer maxItems writes at most this many


def item_schemas(schema: dict) -> tuple[list, Any]:
    """(the schemas of the first items, the schema of every later item), in either draft's
    spelling: 2020-12 `prefixItems` + `items`, or drafts 4-2019 `items` list +
    `additionalItems` (`additionalItems` means nothing beside an `items` schema)."""
    items = schema.get("items", True)
    if isinstance(items, list):
        return items, schema.get("additionalItems", True)
    prefix = schema.get("prefixItems", [])
    if not isinstance(prefix, list):
        raise InvalidSchema("'prefixItems' must be a list")
    return prefix, items


def merged_items(parts: list[dict]) -> dict:
    """The item keywords of allOf parts as one `prefixItems` + `items`: position i obeys
    every part's schema for position i (its prefix entry, or its later-items schema)."""
    shapes = [item_schemas(p) for p in parts if p.keys() & {"items", "prefixItems"}]
    longest = max(len(prefix) for prefix, _ in shapes)
    prefix = [_all_of([p[i] if i < len(p) else rest for p, rest in shapes]) for i in range(longest)]
    out: dict[str, Any] = {"items": _all_of([rest for _, rest in shapes])}
    return {"prefixItems": prefix, **out} if prefix else out


def _all_of(schemas: list) -> Any:
    kept = [s for s in schemas if s is not True and s != {}]
    if any(s is False for s in kept):
        return False
    return True if not kept else kept[0] if len(kept) == 1 else {"allOf": kept}


def array_regex(conv: Any, schema: dict, path: str, depth: int) -> str | None:
    """The regex of the schema's arrays (`conv` is the converter)."""
    prefix, rest = item_schemas(schema)
    lo, hi = schema.get("minItems", 0), schema.get("maxItems")
    if len(prefix) > MAX_PREFIX or lo > MAX_ITEMS:
        raise UnsupportedSchema(
            f"arrays at {path} of {max(len(prefix), lo)} items (at most {MAX_ITEMS} counted, "
            f"{MAX_PREFIX} in a tuple)"
        )
    if hi is not None:
        hi = min(hi, max(lo, MAX_ITEMS))  # longer arrays are not written: stricter
    if schema.get("uniqueItems") is True and (hi is None or hi > 1):
        if prefix or "contains" in schema:
            raise UnsupportedSchema(
                f"'uniqueItems' beside tuple items or 'contains' at {path} (supported: items "
                "of finitely many values)"
            )
        return unique_regex(conv, rest, lo, hi, path)
    if "contains" in schema and (schema.get("minContains", 1) != 0 or "maxContains" in schema):
        if prefix:
            raise UnsupportedSchema(f"'contains' beside tuple items at {path}")
        return contains_regex(conv, schema, rest, lo, hi, path, depth)
    parts = [conv.convert(s, f"{path}/prefixItems/{i}", depth) for i, s in enumerate(prefix)]
    item = conv.convert(rest, f"{path}/items", depth)
    return _array(tuple_body(parts, item, lo, hi, conv.item_sep), conv.ws)


def _array(body: str | None, w: str) -> str | None:
    return None if body is None else f"\\[{w}{body}{w}\\]"


def tuple_body(
    parts: list[str | None], item: str | None, lo: int, hi: int | None, sep: str
) -> str | None:
    """The items of an array between its brackets, lo to hi of them: item i under parts[i]
    (None: no value, so the array ends before it), later ones under `item`. None when no
    such array can be written. `sep` is the regex between two items."""
    n = len(parts)

    def after(i: int) -> str | None:
        """What may follow once i >= 1 items are written (None: nothing can)."""
        may_end = i >= lo
        if hi is not None and i >= hi:
            return "" if may_end else None
        if i >= n:
            if item is None:
                return "" if may_end else None
            top = "" if hi is None else hi - i
            return f"({sep}{item}){{{max(lo - i, 0)},{top}}}"
        rest = after(i + 1) if parts[i] is not None else None
        if rest is None:
            return "" if may_end else None
        more = f"{sep}{parts[i]}{rest}"
        return f"({more})?" if may_end else more

    first = parts[0] if n else item
    rest = None if first is None or hi == 0 else after(1)
    if rest is None:
        return "" if lo == 0 else None
    return f"({first}{rest})?" if lo == 0 else f"{first}{rest}"


def contains_regex(
    conv: Any, schema: dict, item_schema: Any, lo: int, hi: int | None, path: str, depth: int
) -> str | None:
    """Arrays with minContains to maxContains items matching `contains`."""
    sep = conv.item_sep
    least, most = schema.get("minContains", 1), schema.get("maxContains")
    for bound in (least, most):
        if bound is not None and (
            isinstance(bound, bool) or not isinstance(bound, int) or bound < 0
        ):
            raise InvalidSchema(
                f"'minContains'/'maxContains' must be non-negative integers at {path}"
            )
    if (most is not None and most < least) or least > MAX_PREFIX:
        if least > MAX_PREFIX:
            raise UnsupportedSchema(f"'minContains' {least} at {path} (at most {MAX_PREFIX})")
        return None
    match = conv.convert({"allOf": [item_schema, schema["contains"]]}, f"{path}/contains", depth)
    if most is None:  # other items may match too: more matches are fine
        other = conv.convert(item_schema, f"{path}/items", depth)
    else:
        try:
            other = conv.convert(
                {"allOf": [item_schema, {"not": schema["contains"]}]}, f"{path}/contains", depth
            )
        except UnsupportedSchema as e:
            raise UnsupportedSchema(
                f"'maxContains' at {path} needs the items that do not match 'contains': {e}"
            ) from None
    if most == 0 or match is None:
        return _array(tuple_body([], other, lo, hi, conv.item_sep), conv.ws) if least == 0 else None
    if lo > least or hi is not None:
        # Bounded length: the matching items first (stricter), then the others.
        return _array(
            tuple_body([match] * least, other, max(lo, least), hi, conv.item_sep), conv.ws
        )
    # Exact: the first matching item anywhere, then the others anywhere among the rest.
    more = f"{{{least - 1}}}" if most is None else f"{{{max(least - 1, 0)},{most - 1}}}"
    if other is None:
        body = f"{match}({sep}{match}){more}"
    else:
        body = f"({other}{sep})*{match}(({sep}{other})*{sep}{match}){more}({sep}{other})*"
    if least == 0:
        plain = tuple_body([], other, 0, None, conv.item_sep)
        body = f"({plain}|{body})"
    return _array(body, conv.ws)


def unique_regex(conv: Any, item_schema: Any, lo: int, hi: int | None, path: str) -> str | None:
    """Arrays of distinct values of a finite item schema."""
    sep = conv.item_sep
    values = finite_values(conv, item_schema, path)
    if values is None:
        raise UnsupportedSchema(
            f"'uniqueItems' at {path} (supported: items of finitely many values: enum, "
            "const, boolean, null)"
        )
    texts = [conv.literal(v) for v in values]
    longest = len(texts) if hi is None else min(hi, len(texts))
    if lo > longest:
        return None
    if sum(perm(len(texts), n) for n in range(longest + 1)) <= MAX_UNIQUE_SEQUENCES:

        def after(used: tuple[int, ...]) -> str:
            options = [""] if len(used) >= lo else []
            if len(used) < longest:
                options += [f"{sep}{t}{after((*used, i))}" for i, t in enumerate(texts)
                            if i not in used]  # fmt: skip
            return options[0] if len(options) == 1 else "(" + "|".join(options) + ")"

        if not texts:
            return _array("", conv.ws)
        body = "(" + "|".join(f"{t}{after((i,))}" for i, t in enumerate(texts)) + ")"
        return _array(f"({body})?" if lo == 0 else body, conv.ws)
    if lo <= 1 and longest == len(texts):
        # Too many orders to write out: the values in their schema's order, each at most
        # once (stricter).
        return _array(conv.members([(t, False) for t in texts], lo == 1), conv.ws)
    raise UnsupportedSchema(
        f"'uniqueItems' at {path}: {len(texts)} values in sequences of {lo} to {longest} "
        "are too many to write out"
    )


def finite_values(conv: Any, schema: Any, path: str) -> list | None:
    """The distinct values valid under `schema` when they are finitely many and known
    (enum, const, boolean, null); None otherwise."""
    schema = conv.deref(schema)
    if schema is False:
        return []
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        candidates = [schema["const"]]
    elif isinstance(schema.get("enum"), list):
        candidates = schema["enum"]
    else:
        types = schema.get("type")
        types = [types] if isinstance(types, str) else types
        if not isinstance(types, list) or not set(types) <= {"boolean", "null"}:
            return None
        candidates = [v for t in types for v in ((True, False) if t == "boolean" else (None,))]
    try:
        valid = [v for v in candidates if is_valid(v, schema, lambda r: conv.resolve(r, path))]
    except UnsupportedSchema:
        return None
    distinct: list = []
    for v in valid:
        if not any(json_equal(v, d) for d in distinct):
            distinct.append(v)
    return distinct
