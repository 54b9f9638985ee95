"""Bounded integer and number regexes against exact decimal comparison: a number written
the way JSON writes it (no exponent) matches exactly when it lies within the bounds."""

from __future__ import annotations

import re
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from braid.grammars.json_schema.ranges import integer_regex, number_regex

# Bounds and values with a few fractional digits, so that they meet the bounds often.
DECIMALS = st.builds(
    lambda whole, digits, negative: (-1 if negative else 1) * Decimal(f"{whole}.{digits}"),
    st.integers(0, 12),
    st.sampled_from(["0", "1", "05", "1", "25", "5", "501", "99", "999", "0001"]),
    st.booleans(),
)


@st.composite
def written(draw) -> str:
    """A JSON number as text: canonical integer part, optional fraction, trailing zeros."""
    whole = draw(st.integers(0, 13))
    fraction = draw(
        st.sampled_from(
            [
                "",
                ".0",
                ".00",
                ".05",
                ".1",
                ".10",
                ".25",
                ".2501",
                ".5",
                ".501",
                ".9",
                ".99",
                ".999",
                ".9999",
                ".0001",
            ]
        )
    )
    return ("-" if draw(st.booleans()) else "") + f"{whole}{fraction}"


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(st.none(), DECIMALS),
    st.one_of(st.none(), DECIMALS),
    st.booleans(),
    st.booleans(),
    st.lists(written(), min_size=20, max_size=20),
)
def test_number_bounds_are_exact(lo, hi, lo_excl, hi_excl, texts):
    lo_excl, hi_excl = lo_excl and lo is not None, hi_excl and hi is not None
    regex = number_regex(
        None if lo is None else float(lo), None if hi is None else float(hi), lo_excl, hi_excl
    )
    for text in texts:
        value = Decimal(text)
        inside = (lo is None or value > lo or (value == lo and not lo_excl)) and (
            hi is None or value < hi or (value == hi and not hi_excl)
        )
        matched = regex is not None and re.fullmatch(regex, text) is not None
        assert matched == inside, (text, lo, lo_excl, hi, hi_excl, regex)


def test_negative_zero_is_zero():
    """JSON's -0 equals 0: inside a range that holds 0, outside one that excludes it."""
    for lo, lo_excl, inside in [(0.0, False, True), (0.0, True, False), (-1.0, False, True)]:
        regex = number_regex(lo, None, lo_excl, False)
        assert bool(re.fullmatch(regex, "-0")) == inside
        assert bool(re.fullmatch(regex, "-0.00")) == inside
    assert re.fullmatch(integer_regex(0, 5), "-0")
    assert re.fullmatch(integer_regex(None, None), "-0")
    assert not re.fullmatch(integer_regex(1, 5), "-0")


def test_fractional_bounds_of_a_real_schema():
    regex = number_regex(0.1, None, False, False)  # "cpus": {"minimum": 0.1}
    assert [
        t for t in ["0", "0.05", "0.1", "0.10", "0.5", "2", "12.75"] if re.fullmatch(regex, t)
    ] == ["0.1", "0.10", "0.5", "2", "12.75"]
    assert number_regex(0.5, 0.5, True, False) is None


@settings(deadline=None)
@given(st.integers(-300, 300), st.integers(-300, 300), st.integers(-400, 400))
def test_integer_bounds_are_exact(lo, hi, value):
    regex = integer_regex(lo, hi)
    matched = regex is not None and re.fullmatch(regex, str(value)) is not None
    assert matched == (lo <= value <= hi)
