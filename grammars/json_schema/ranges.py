"""Regexes for integers and numbers within bounds, written as JSON writes them.

Integers are canonical decimals (no leading zeros). A bounded number is an integer part and
an optional fraction, no exponent: splitting the range on the integer part keeps the regex
exact (x >= 3 is "integer part >= 3, any fraction"; x <= 3.25 is "integer part < 3 with
any fraction, or 3 with a fraction up to .25", the fraction compared digit by digit).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

NATURAL = "(0|[1-9][0-9]*)"


def number_bounds(schema: dict) -> tuple[Any, bool, Any, bool]:
    """(low, low exclusive, high, high exclusive) of a schema's minimum/maximum, accepting
    draft-4 boolean exclusives and draft-6 numeric ones (the tighter bound wins); unchecked."""
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
    return lo, lo_excl, hi, hi_excl


def integer_regex(lo: int | None, hi: int | None) -> str | None:
    """Integers in [lo, hi] (None: unbounded); None if there are none."""
    if lo is not None and hi is not None and lo > hi:
        return None
    parts = []
    if lo is None or lo < 0:  # the negatives: magnitudes in [max(-hi, 1), -lo]
        top = None if lo is None else -lo
        bottom = 1 if hi is None or hi >= 0 else -hi
        if top is None or bottom <= top:
            parts.append("-" + natural_range(bottom, top))
    if hi is None or hi >= 0:
        parts.append(natural_range(max(lo or 0, 0), hi))
        if lo is None or lo <= 0:
            parts.append("-0")  # -0 is 0: the negatives above start at -1
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def number_regex(lo: float | None, hi: float | None, lo_excl: bool, hi_excl: bool) -> str | None:
    """Numbers in the interval; unbounded numbers may use exponents, bounded ones do not."""
    if lo is None and hi is None:
        return rf"-?{NATURAL}(\.[0-9]+)?([eE][+-]?[0-9]+)?"
    # Bounds as the decimals the schema wrote (0.1 is "0.1", not the float's binary value).
    lo = None if lo is None else Decimal(repr(lo))
    hi = None if hi is None else Decimal(repr(hi))
    parts = []
    if lo is None or lo < 0:  # negatives: magnitude in [max(-hi, 0), -lo]
        m_lo, m_lo_excl = (Decimal(0), False) if hi is None or hi > 0 else (-hi, hi_excl)
        m_hi, m_hi_excl = (None, False) if lo is None else (-lo, lo_excl)
        neg = _magnitudes(m_lo, m_lo_excl, m_hi, m_hi_excl)
        if neg is not None:
            parts.append("-" + neg)
    if hi is None or hi >= 0:
        p_lo, p_lo_excl = (Decimal(0), False) if lo is None or lo < 0 else (lo, lo_excl)
        pos = _magnitudes(p_lo, p_lo_excl, hi, hi_excl)
        if pos is not None:
            parts.append(pos)
    zero_inside = hi is None or hi > 0 or (hi == 0 and not hi_excl)
    if lo == 0 and not lo_excl and zero_inside:
        parts.append(r"-0(\.0+)?")  # -0 is 0: the negatives above start below it
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def _magnitudes(a: Decimal, a_excl: bool, b: Decimal | None, b_excl: bool) -> str | None:
    """Non-negative decimals x (integer part + optional fraction) with a <(=) x <(=) b:
    split on the integer part, only the two bounds' own integer parts constrain the
    fraction."""
    if b is not None and (a > b or (a == b and (a_excl or b_excl))):
        return None
    (a_int, a_frac), (b_int, b_frac) = _split(a), _split(b) if b is not None else (None, None)
    if a_int == b_int:
        fraction = _fraction(a_frac, a_excl, b_frac, b_excl)
        return None if fraction is None else f"{a_int}{fraction}"
    parts = []
    low = _fraction(a_frac, a_excl, None, False)
    if low is not None:
        parts.append(f"{a_int}{low}")
    if b_int is None or a_int + 1 <= b_int - 1:  # integer parts strictly between
        middle = natural_range(a_int + 1, None if b_int is None else b_int - 1)
        parts.append(rf"{middle}(\.[0-9]+)?")
    high = None if b_int is None else _fraction(None, False, b_frac, b_excl)
    if high is not None:
        parts.append(f"{b_int}{high}")
    return "(" + "|".join(parts) + ")" if parts else None


def _split(x: Decimal) -> tuple[int, str]:
    """(integer part, fraction digits without trailing zeros) of x >= 0."""
    whole, _, fraction = format(x, "f").partition(".")
    return int(whole), fraction.rstrip("0")


def _fraction(lo: str | None, lo_excl: bool, hi: str | None, hi_excl: bool) -> str | None:
    """The written fraction (absent, or a dot and digits) of numbers whose fractional value
    f is within the bounds, each bound given by its digits after the point ("" is 0, None
    is no bound); None when no fraction is."""
    absent = (lo is None or (lo == "" and not lo_excl)) and not (hi == "" and hi_excl)
    digits = _digits(lo, lo_excl, hi, hi_excl, need_digit=True)
    if digits is None:
        return "" if absent else None
    return rf"(\.{digits})?" if absent else rf"\.{digits}"


def _digits(lo: str | None, lo_excl: bool, hi: str | None, hi_excl: bool, need_digit: bool):
    """Digit strings s with lo <(=) 0.s <(=) hi (trailing zeros and the empty string are
    worth what they say), built one digit at a time: each digit either settles a bound
    (above lo's digit, below hi's) or keeps following it."""
    if lo == "" and not lo_excl:
        lo = None  # f >= 0 always holds
    if lo is None and hi is None:
        return "[0-9]+" if need_digit else "[0-9]*"
    if lo is None and hi == "":
        return None if hi_excl else ("0+" if need_digit else "0*")
    if lo == "" and hi is None:  # f > 0: a nonzero digit somewhere
        return "[0-9]*[1-9][0-9]*"
    if lo == "" and hi == "":
        return None
    branches: list[tuple[int, int, tuple]] = []  # (first digit, last digit, next bounds)
    for c in range(10):
        d = str(c)
        if lo is None or (lo == "" and c > 0) or (lo and d > lo[0]):
            next_lo = None
        elif lo == "" or (lo and d == lo[0]):
            next_lo = lo[1:]
        else:
            continue
        if hi is None or (hi and d < hi[0]):
            next_hi = None
        elif (hi == "" and c == 0) or (hi and d == hi[0]):
            next_hi = hi[1:]
        else:
            continue
        state = (next_lo, next_hi)
        if branches and branches[-1][2] == state and branches[-1][1] == c - 1:
            branches[-1] = (branches[-1][0], c, state)
        else:
            branches.append((c, c, state))
    options = []
    for first, last, (next_lo, next_hi) in branches:
        rest = _digits(next_lo, lo_excl, next_hi, hi_excl, need_digit=False)
        if rest is not None:
            head = str(first) if first == last else f"[{first}-{last}]"
            options.append(head + rest)
    empty = not need_digit and lo is None and not (hi == "" and hi_excl)
    if not options:
        return "" if empty else None
    body = options[0] if len(options) == 1 else "(" + "|".join(options) + ")"
    return f"({body})?" if empty else body


def natural_range(a: int, b: int | None) -> str:
    """Canonical decimals of the integers in [a, b], 0 <= a <= b (b None: unbounded)."""
    if b is None:
        digits = len(str(a))
        bounded = natural_range(a, 10**digits - 1)
        return f"({bounded}|[1-9][0-9]{{{digits},}})"
    parts = []
    for digits in range(len(str(a)), len(str(b)) + 1):
        lo = max(a, 10 ** (digits - 1) if digits > 1 else 0)
        hi = min(b, 10**digits - 1)
        if lo <= hi:
            parts.append(_same_length(str(lo), str(hi)))
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def _same_length(lo: str, hi: str) -> str:
    """Numbers from lo to hi, both written with the same number of digits."""
    if lo == hi:
        return lo
    if len(lo) == 1:
        return f"[{lo}-{hi}]"
    rest = len(lo) - 1
    if lo[1:] == "0" * rest and hi[1:] == "9" * rest:
        return f"[{lo[0]}-{hi[0]}][0-9]{{{rest}}}"
    if lo[0] == hi[0]:
        return lo[0] + _same_length(lo[1:], hi[1:])
    parts = [lo[0] + _same_length(lo[1:], "9" * rest)]
    if int(hi[0]) - int(lo[0]) > 1:
        parts.append(f"[{int(lo[0]) + 1}-{int(hi[0]) - 1}][0-9]{{{rest}}}")
    parts.append(hi[0] + _same_length("0" * rest, hi[1:]))
    return "(" + "|".join(parts) + ")"
