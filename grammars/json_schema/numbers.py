"""Integers and numbers: bounds (checked, then written by ranges.py), multipleOf, integers
less excluded values, and numbers that are not integers."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

from braid.grammars.json_schema.errors import InvalidSchema, UnsupportedSchema
from braid.grammars.json_schema.json_text import alternatives
from braid.grammars.json_schema.ranges import integer_regex, number_bounds, number_regex

_BOUNDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}


def integer_except(schema: dict, excluded: list, path: str) -> str | None:
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
    return alternatives(pieces)


def bounded_number(schema: dict, path: str) -> str | None:
    """The regex of the schema's numbers."""
    if "multipleOf" in schema:
        return _number_multiple(schema, path)
    lo, lo_excl, hi, hi_excl = _number_bounds(schema, path)
    return number_regex(lo, hi, lo_excl, hi_excl)


def _number_multiple(schema: dict, path: str) -> str | None:
    """multipleOf 1 on a number: the integers within the bounds (2.0 is valid too, but
    not written: stricter, safe). multipleOf 0.1, 0.01, ... without bounds: decimals of
    at most that many fraction digits."""
    step = schema["multipleOf"]
    if isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0:
        raise InvalidSchema(f"'multipleOf' must be a positive number at {path}")
    if step == 1:
        return integer_except(schema, [], path)
    places = -Decimal(repr(step)).normalize().as_tuple().exponent
    unbounded = not schema.keys() & _BOUNDS
    if places > 0 and Decimal(repr(step)) == Decimal(1).scaleb(-places) and unbounded:
        return rf"-?(0|[1-9][0-9]*)(\.[0-9]{{1,{places}}})?"
    raise UnsupportedSchema(
        f"'multipleOf' {step} on a number at {path} (supported: 1, and 0.1, 0.01, ... "
        "without bounds)"
    )


def non_integer(schema: dict, path: str) -> str:
    """A number that is not an integer (`not` of integer). A validator reads the JSON
    number as a binary float, so 1.00000000000000001 is the integer 1: the digits are
    kept within a float's precision (6 before the point, 8 after: stricter, safe)."""
    if schema.keys() & (_BOUNDS | {"multipleOf"}):
        raise UnsupportedSchema(
            f"'not' of integer beside number bounds at {path} (supported without bounds)"
        )
    return r"-?(0|[1-9][0-9]{0,5})\.[0-9]{0,7}[1-9]"


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
