"""A JSON-schema `pattern` (an ECMA-262 regex, searched anywhere in the string) rewritten to
match the string's JSON-encoded content exactly.

The pattern describes the decoded value, the grammar matches the encoded text, so every
atom is rewritten: `"` and `\\` become their escapes, `.` and negated classes exclude what
JSON must escape, `\\d`/`\\w` mean ASCII as in ECMA-262. Constructs a DFA cannot express
(lookaround, backreferences, word boundaries) raise UnsupportedSchema.
"""

from __future__ import annotations

from braid.grammars.json_schema.errors import UnsupportedSchema

MAX_COUNT = 1000  # largest {n,m} bound accepted

# Code points a JSON string may hold unescaped are all but these.
_MUST_ESCAPE = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]
_ENCODED = {'"': r"\\\"", "\\": r"\\\\", "\n": r"\\n", "\t": r"\\t", "\r": r"\\r", "\f": r"\\f"}
_CLASS_ESCAPES = {
    "d": [(0x30, 0x39)],
    "w": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    "s": [(0x20, 0x20)],  # other ECMA spaces need escapes in JSON: left out (stricter)
}
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}


def pattern_regex(pattern: str, char: str, path: str, plain: bool = False) -> str:
    """Regex for the encoded content of strings that `pattern` matches somewhere in.

    `plain`: one regex character per string character (no escapes), for a length bound to
    count them; a literal that JSON must escape then raises UnsupportedSchema."""
    if not isinstance(pattern, str):
        raise UnsupportedSchema(f"'pattern' must be a string at {path}")
    return _Parser(pattern, char, path, plain).top()


class _Parser:
    def __init__(self, pattern: str, char: str, path: str, plain: bool) -> None:
        self.s = pattern
        self.i = 0
        self.char = char  # any one JSON string character, encoded
        self.path = path
        self.plain = plain

    def fail(self, what: str) -> UnsupportedSchema:
        return UnsupportedSchema(f"'pattern' {self.s!r} at {self.path}: {what}")

    def peek(self) -> str | None:
        return self.s[self.i] if self.i < len(self.s) else None

    def take(self) -> str:
        c = self.s[self.i]
        self.i += 1
        return c

    def top(self) -> str:
        branches = [self.branch(top=True)]
        while self.peek() == "|":
            self.take()
            branches.append(self.branch(top=True))
        if self.i != len(self.s):
            raise self.fail(f"unexpected {self.s[self.i]!r}")
        return branches[0] if len(branches) == 1 else "(" + "|".join(branches) + ")"

    def branch(self, top: bool = False) -> str:
        anchored_start = top and self.peek() == "^"
        if anchored_start:
            self.take()
        out = []
        anchored_end = False
        while (c := self.peek()) is not None and c not in "|)":
            if c == "$":
                self.take()
                if not top or self.peek() not in (None, "|"):
                    raise self.fail("'$' is supported only at the end")
                anchored_end = True
                break
            if c == "^":
                raise self.fail("'^' is supported only at the start")
            out.append(self.quantified(self.atom()))
        body = "".join(out)
        if top:
            # A pattern matches anywhere in the value unless anchored.
            if not anchored_start:
                body = f"{self.char}*{body}"
            if not anchored_end:
                body = f"{body}{self.char}*"
        return f"({body})"

    def atom(self) -> str:
        c = self.take()
        if c == ".":
            return _class([(0, 0x10FFFF)], negate=False, exclude_newlines=True)
        if c == "[":
            return self.char_class()
        if c == "(":
            if self.s.startswith("?:", self.i):
                self.i += 2
            elif self.peek() == "?":
                if self.s.startswith("?<", self.i) and self.s[self.i + 2 : self.i + 3] not in "=!":
                    self.i = self.s.index(">", self.i) + 1  # a named group: the name is moot
                else:
                    raise self.fail("lookaround is not supported")
            inner = [self.branch()]
            while self.peek() == "|":
                self.take()
                inner.append(self.branch())
            if self.peek() != ")":
                raise self.fail("unbalanced parenthesis")
            self.take()
            return "(" + "|".join(inner) + ")"
        if c == "\\":
            return self.escape_atom()
        if c in "*+?{":
            if c == "{" and not self._counted_ahead(self.i - 1):
                return self.literal(c)
            raise self.fail(f"nothing to repeat before {c!r}")
        return self.literal(c)

    def literal(self, c: str) -> str:
        if self.plain and (c in _ENCODED or ord(c) < 0x20):
            raise self.fail(f"{c!r}, which JSON escapes, next to length bounds")
        return _literal(c)

    def escape_atom(self) -> str:
        if self.peek() is None:
            raise self.fail("trailing backslash")
        c = self.take()
        if c.lower() in _CLASS_ESCAPES:
            return _class(_CLASS_ESCAPES[c.lower()], negate=c.isupper())
        if c in "bB":
            raise self.fail("word boundaries are not supported")
        if c.isdigit() and c != "0":
            raise self.fail("backreferences are not supported")
        if c in "pPk":
            raise self.fail(f"'\\{c}' is not supported")
        return self.literal(self.escaped_char(c))

    def escaped_char(self, c: str) -> str:
        if c in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[c]
        if c in "ux":
            width = 4 if c == "u" else 2
            digits = self.s[self.i : self.i + width]
            if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"bad '\\{c}' escape")
            self.i += width
            return chr(int(digits, 16))
        if c.isalnum():
            raise self.fail(f"unknown escape '\\{c}'")
        return c  # an escaped punctuation character stands for itself

    def char_class(self) -> str:
        negate = self.peek() == "^"
        if negate:
            self.take()
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            c = self.peek()
            if c is None:
                raise self.fail("unterminated character class")
            if c == "]" and not first:
                self.take()
                break
            first = False
            self.take()
            if c == "\\":
                e = self.take()
                if e.lower() in _CLASS_ESCAPES:
                    if e.isupper():
                        raise self.fail(f"'\\{e}' inside a class is not supported")
                    ranges += _CLASS_ESCAPES[e]
                    continue
                if e == "b":
                    lo = "\b"
                else:
                    lo = self.escaped_char(e)
            else:
                lo = c
            if self.peek() == "-" and self.s[self.i + 1 : self.i + 2] not in ("]", ""):
                self.take()
                h = self.take()
                hi = self.escaped_char(self.take()) if h == "\\" else h
                if ord(hi) < ord(lo):
                    raise self.fail("a character range runs backwards")
                ranges.append((ord(lo), ord(hi)))
            else:
                ranges.append((ord(lo), ord(lo)))
        return _class(ranges, negate)

    def quantified(self, atom: str) -> str:
        c = self.peek()
        if c is None:
            return atom
        if c in "*+?":
            self.take()
            quant = c
        elif c == "{" and self._counted_ahead(self.i):
            end = self.s.index("}", self.i)
            spec = self.s[self.i + 1 : end]
            self.i = end + 1
            lo, _, hi = spec.partition(",")
            if int(lo) > MAX_COUNT or (hi and int(hi) > MAX_COUNT):
                raise self.fail(f"a repetition count above {MAX_COUNT}")
            if hi and int(hi) < int(lo):
                raise self.fail("a repetition range runs backwards")
            quant = "{" + spec + "}"
        else:
            return atom
        if self.peek() == "?":  # lazy: the same strings match
            self.take()
        return f"{atom}{quant}"

    def _counted_ahead(self, at: int) -> bool:
        end = self.s.find("}", at)
        if end < 0:
            return False
        lo, comma, hi = self.s[at + 1 : end].partition(",")
        return lo.isdigit() and (not comma or hi == "" or hi.isdigit())


def _literal(c: str) -> str:
    """One decoded character as its JSON-encoded form."""
    if c in _ENCODED:
        return f"({_ENCODED[c]})"
    if ord(c) < 0x20:
        return f"(\\\\u{ord(c):04x})"
    return _class([(ord(c), ord(c))], negate=False)


def _class(ranges: list[tuple[int, int]], negate: bool, exclude_newlines: bool = False) -> str:
    """A class over the characters JSON writes unescaped (escaped ones are left out, which
    only makes the grammar stricter)."""
    excluded = list(_MUST_ESCAPE)
    if exclude_newlines:
        excluded += [(0x2028, 0x2029)]
    if negate:
        return "[^" + "".join(_range(lo, hi) for lo, hi in ranges + excluded) + "]"
    kept = _subtract(ranges, excluded)
    if not kept:
        raise UnsupportedSchema("a 'pattern' character class holds only characters JSON escapes")
    return "[" + "".join(_range(lo, hi) for lo, hi in kept) + "]"


def _subtract(
    ranges: list[tuple[int, int]], removed: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    out = ranges
    for r_lo, r_hi in removed:
        nxt = []
        for lo, hi in out:
            if hi < r_lo or lo > r_hi:
                nxt.append((lo, hi))
                continue
            if lo < r_lo:
                nxt.append((lo, r_lo - 1))
            if hi > r_hi:
                nxt.append((r_hi + 1, hi))
        out = nxt
    return out


def _range(lo: int, hi: int) -> str:
    return _class_char(lo) if lo == hi else f"{_class_char(lo)}-{_class_char(hi)}"


def _class_char(cp: int) -> str:
    c = chr(cp)
    if c in "\\]^-[&~|":
        return "\\" + c
    if cp < 0x20 or cp == 0x7F:
        return f"\\x{cp:02x}"
    if 0xD800 <= cp <= 0xDFFF or cp > 0xFFFF:
        return f"\\U{cp:08x}" if cp > 0xFFFF else f"\\u{cp:04x}"
    return c
