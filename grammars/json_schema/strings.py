"""Strings: minLength/maxLength, pattern and format (alone or under length bounds), and the
strings that are none of some names."""

from __future__ import annotations

import re
from typing import Any

from braid.grammars.compiling.constraint_regex import escape
from braid.grammars.json_schema.errors import UnsupportedSchema
from braid.grammars.json_schema.formats import FORMAT_LENGTHS, FORMATS, MISSING_FORMATS
from braid.grammars.json_schema.json_text import CHAR, STRING
from braid.grammars.json_schema.keywords import check_bound
from braid.grammars.json_schema.pattern import pattern_regex

# Counted characters (minLength/maxLength) cost automaton states per count: a plain character
# one, a two-character escape (\n, \", ...) one more, a \u escape six more. Counted strings
# take plain characters and the two-character escapes (a quote or a newline in a bounded
# description is ordinary) but not \u escapes (stricter, hence safe); a maxLength above
# MAX_STRING_CHARS generates at most that many. (Which backend compiles the regex, an eager
# outlines index or the lazy automaton, is grammars/compiling/jobs.py's choice.) Patterns and
# formats under length bounds count plain characters only.
PLAIN_CHAR = r'[^"\\\x00-\x1f]'
COUNTED_CHAR = r'([^"\\\x00-\x1f]|\\["\\/bfnrt])'
MAX_STRING_CHARS = 4096

# A pattern that is one character (class, escape or literal) repeated, anchored at both ends.
_ONE_REPEATED = re.compile(
    r"\^(\[(?:\\.|[^\]\\])+\]|\\[dwsDWS]|\.|[^\\^$.|?*+()\[\]{}])"
    r"([+*]|\{\d+(?:,\d*)?\})\$"
)


def string_regex(schema: dict, path: str) -> str | None:
    """The regex of the schema's strings (None: no string can be written)."""
    lo, hi = schema.get("minLength", 0), schema.get("maxLength")
    check_bound(lo, hi, "minLength", "maxLength", path)
    fmt, pattern = schema.get("format"), schema.get("pattern")
    if fmt in MISSING_FORMATS:
        raise UnsupportedSchema(f"unsupported string format {fmt!r} at {path}")
    if fmt is not None and pattern is not None:
        raise UnsupportedSchema(f"'format' together with 'pattern' at {path}")
    if pattern is not None:
        if (lo, hi) != (0, None):
            return _counted_pattern(pattern, lo, hi, path)
        return f'"{pattern_regex(pattern, CHAR, path)}"'
    if fmt is not None:
        shortest, longest = FORMAT_LENGTHS.get(fmt, (1, None))
        if lo > shortest or (hi is not None and (longest is None or hi < longest)):
            return _length_bounded(FORMATS[fmt], lo, hi, path)  # formats are plain
        return f'"{FORMATS[fmt]}"'
    if lo > MAX_STRING_CHARS:
        raise UnsupportedSchema(f"minLength {lo} at {path} exceeds {MAX_STRING_CHARS}")
    if hi is None:
        return f'"{COUNTED_CHAR}{{{lo}}}{CHAR}*"' if lo else STRING
    return f'"{COUNTED_CHAR}{{{lo},{min(hi, max(lo, MAX_STRING_CHARS))}}}"'


def _counted_pattern(pattern: Any, lo: int, hi: int | None, path: str) -> str | None:
    """Length bounds next to a pattern. One repeated character (`^[a-z]+$`): the two
    counts meet, a plain regex. Any other: a length lookahead (_length_bounded)."""
    match = _ONE_REPEATED.fullmatch(pattern) if isinstance(pattern, str) else None
    if match is None:
        content = pattern_regex(pattern, PLAIN_CHAR, path, plain=True)
        return _length_bounded(content, lo, hi, path)
    atom, quantifier = match.groups()
    if quantifier in ("+", "*"):
        q_lo, q_hi = (1 if quantifier == "+" else 0), None
    else:
        low, comma, high = quantifier[1:-1].partition(",")
        q_lo = int(low)
        q_hi = int(high) if high else (None if comma else q_lo)
    lo = max(lo, q_lo)
    if q_hi is not None:
        hi = q_hi if hi is None else min(hi, q_hi)
    if lo > MAX_STRING_CHARS:
        raise UnsupportedSchema(f"minLength {lo} at {path} exceeds {MAX_STRING_CHARS}")
    if hi is not None and lo > hi:
        return None
    char = pattern_regex(f"^{atom}$", CHAR, path)  # one code point, encoded
    top = "" if hi is None else min(hi, max(lo, MAX_STRING_CHARS))
    return f'"{char}{{{lo},{top}}}"'


def _length_bounded(content: str, lo: int, hi: int | None, path: str) -> str | None:
    """A string whose content matches `content` (a regex of plain characters, one per
    string character) and has lo to hi characters: `(?=C{lo,hi}")(content)"`, a
    lookahead Python's re reads as written and the lazy automaton compiles as the
    intersection (outlines cannot, so these regexes go to the lazy automaton)."""
    if lo > MAX_STRING_CHARS:
        raise UnsupportedSchema(f"minLength {lo} at {path} exceeds {MAX_STRING_CHARS}")
    if hi is not None and lo > hi:
        return None
    top = "" if hi is None else min(hi, max(lo, MAX_STRING_CHARS))
    return f'"(?={PLAIN_CHAR}{{{lo},{top}}}")({content})"'


def string_not_in(names: list[str]) -> str:
    """The content of a JSON string (a key, a value) that is none of `names`, in plain
    characters: with no escapes, no other spelling of a listed name can slip through."""
    trie: dict = {}
    for name in names:
        if not any(c in '"\\' or ord(c) < 0x20 for c in name):
            node = trie
            for c in name:
                node = node.setdefault(c, {})
            node[None] = {}  # a name ends here

    def below(node: dict) -> str:
        chars = [c for c in node if c is not None]
        options = [] if None in node else [""]
        others = "".join(escape(c) for c in chars)
        options.append(f'[^"\\\\\\x00-\\x1f{others}]{PLAIN_CHAR}*')
        options += [f"{escape(c)}{below(node[c])}" for c in chars]
        return "(" + "|".join(options) + ")"

    return below(trie)
