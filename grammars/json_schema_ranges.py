"""Regexes for integers and numbers within bounds, written as JSON writes them.

Integers are canonical decimals (no leading zeros). A bounded number is an integer part and
an optional fraction, no exponent: splitting the range on the integer part keeps the regex
exact (x >= 3 is "integer part >= 3, any fraction"; x <= 3 is "integer part < 3 with any
fraction, or 3 with an all-zero fraction").
"""

from __future__ import annotations

from grammars.schema_errors import UnsupportedSchema

NATURAL = "(0|[1-9][0-9]*)"
ANY_FRACTION = r"(\.[0-9]+)?"
ZERO_FRACTION = r"(\.0+)?"
NONZERO_FRACTION = r"\.[0-9]*[1-9][0-9]*"


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
    return parts[0] if len(parts) == 1 else f"({parts[0]}|{parts[1]})"


def number_regex(
    lo: float | None, hi: float | None, lo_excl: bool, hi_excl: bool, path: str = "#"
) -> str | None:
    """Numbers in the interval; unbounded numbers may use exponents, bounded ones do not."""
    if lo is None and hi is None:
        return rf"-?{NATURAL}(\.[0-9]+)?([eE][+-]?[0-9]+)?"
    for bound in (lo, hi):
        if bound is not None and not float(bound).is_integer():
            raise UnsupportedSchema(f"a non-integer number bound ({bound}) at {path}")
    lo = None if lo is None else int(lo)
    hi = None if hi is None else int(hi)
    parts = []
    if lo is None or lo < 0:  # negatives: magnitude in [max(-hi, 0), -lo]
        m_lo, m_lo_excl = (0, False) if hi is None or hi >= 0 else (-hi, hi_excl)
        m_hi, m_hi_excl = (None, False) if lo is None else (-lo, lo_excl)
        neg = _magnitudes(m_lo, m_lo_excl, m_hi, m_hi_excl)
        if neg is not None:
            parts.append("-" + neg)
    if hi is None or hi >= 0:
        p_lo, p_lo_excl = (0, False) if lo is None or lo < 0 else (lo, lo_excl)
        pos = _magnitudes(p_lo, p_lo_excl, hi, hi_excl)
        if pos is not None:
            parts.append(pos)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else f"({parts[0]}|{parts[1]})"


def _magnitudes(a: int, a_excl: bool, b: int | None, b_excl: bool) -> str | None:
    """Non-negative decimals x (integer part + optional fraction) with a <(=) x <(=) b."""
    if b is not None and (a > b or (a == b and (a_excl or b_excl))):
        return None
    if a == b:
        return f"{a}{ZERO_FRACTION}"
    parts = [f"{a}{NONZERO_FRACTION if a_excl else ANY_FRACTION}"]  # integer part a
    middle = natural_range(a + 1, None if b is None else b - 1)  # strictly between
    if b is None or a + 1 <= b - 1:
        parts.append(f"{middle}{ANY_FRACTION}")
    if b is not None and not b_excl:
        parts.append(f"{b}{ZERO_FRACTION}")
    return "(" + "|".join(parts) + ")"


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
