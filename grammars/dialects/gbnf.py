"""GBNF, the grammar dialect of llama.cpp's `grammar` field and of XGrammar's EBNF (SGLang's
`ebnf`, vLLM's `grammar`), read into grammar nodes.

    root ::= answer ("," ws answer)*
    answer ::= "yes" | "no" | [0-9]{1,3}   # a comment
    ws ::= [ \\t\\n]*

A rule runs until the next `name ::=`, so alternatives may continue on the next lines
(llama.cpp's and XGrammar's layouts both read). Token references (`<[id]>`, `<|name|>`) and
XGrammar's lookahead assertions `(= ...)` and built-in macros are refused, naming them.
"""

from __future__ import annotations

import re

from braid.grammars.dialects.tree import Alt, Chars, Lit, Node, Ref, Rep, Rules, Seq

WHERE = "GBNF grammar"
_TOKEN = re.compile(
    r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<define>::=)
  | (?P<name>[A-Za-z_][A-Za-z0-9_\-.]*)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<chars>\[(?:[^\]\\]|\\.)*\])
  | (?P<count>\{\s*\d*\s*(?:,\s*\d*\s*)?\})
  | (?P<lookahead>\(\s*=)
  | (?P<op>[()|*+?.])
  | (?P<token><\[[^\]]*\]>|<\|[^|]*\|>)
    """,
    re.VERBOSE | re.DOTALL,
)
_ESCAPES = {
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "[": "[",
    "]": "]",
    "-": "-",
    "^": "^",
    "/": "/",
}
_HEX = {"x": 2, "u": 4, "U": 8}
MAX_COUNT = 10_000  # largest {m,n} bound


def read(text: str) -> Rules:
    tokens = _tokens(text)
    parser = _Parser(tokens)
    rules: dict[str, Node] = {}
    while not parser.done():
        name = parser.expect("name")
        parser.expect("define")
        if name in rules:
            raise ValueError(f"{WHERE}: rule `{name}` is defined twice")
        rules[name] = parser.alternatives()
    grammar = Rules(rules, "root", WHERE)
    grammar.check()
    return grammar


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"{WHERE}: unexpected {text[pos : pos + 20]!r} at offset {pos}")
        kind = m.lastgroup
        if kind == "lookahead":
            raise ValueError(f"{WHERE}: lookahead assertions (= ...) are not supported")
        if kind == "token":
            raise ValueError(f"{WHERE}: token references such as {m.group()} are not supported")
        if kind != "space":
            out.append((kind, m.group()))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.i = 0

    def done(self) -> bool:
        return self.i >= len(self.tokens)

    def peek(self, ahead: int = 0) -> tuple[str, str]:
        j = self.i + ahead
        return self.tokens[j] if j < len(self.tokens) else ("end", "")

    def expect(self, kind: str) -> str:
        got = self.peek()
        if got[0] != kind:
            raise ValueError(f"{WHERE}: expected {kind}, got {got[1] or 'the end'!r}")
        self.i += 1
        return got[1]

    def starts_rule(self) -> bool:
        return self.peek()[0] == "name" and self.peek(1)[0] == "define"

    def alternatives(self) -> Node:
        options = [self.sequence()]
        while self.peek() == ("op", "|"):
            self.i += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self) -> Node:
        items = []
        while not self.done() and not self.starts_rule() and self.peek()[1] not in ("|", ")"):
            items.append(self.postfix(self.atom()))
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def atom(self) -> Node:
        kind, text = self.peek()
        self.i += 1
        if kind == "name":
            return Ref(text)
        if kind == "string":
            return Lit(unescape(text[1:-1]))
        if kind == "chars":
            return _chars(text[1:-1])
        if (kind, text) == ("op", "."):
            return Chars((), True)
        if (kind, text) == ("op", "("):
            inner = self.alternatives()
            self.expect("op")
            return inner
        raise ValueError(f"{WHERE}: unexpected {text or 'end'!r}")

    def postfix(self, node: Node) -> Node:
        while True:
            kind, text = self.peek()
            if (kind, text) == ("op", "*"):
                node = Rep(node, 0, None)
            elif (kind, text) == ("op", "+"):
                node = Rep(node, 1, None)
            elif (kind, text) == ("op", "?"):
                node = Rep(node, 0, 1)
            elif kind == "count":
                node = Rep(node, *_count(text))
            else:
                return node
            self.i += 1


def _count(text: str) -> tuple[int, int | None]:
    body = text[1:-1].replace(" ", "")
    lo, comma, hi = body.partition(",")
    low = int(lo) if lo else 0
    high = (int(hi) if hi else None) if comma else low
    if high is not None and high < low or max(low, high or 0) > MAX_COUNT:
        raise ValueError(f"{WHERE}: bad repetition {text} (bounds up to {MAX_COUNT})")
    return low, high


def unescape(body: str, where: str = WHERE) -> str:
    """A string literal's body with its escapes (\\n, \\t, \\\\, \\", \\xHH, \\uHHHH, ...) read."""
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        e = body[i + 1]
        if e in _HEX:
            digits = body[i + 2 : i + 2 + _HEX[e]]
            if len(digits) != _HEX[e] or not re.fullmatch(r"[0-9a-fA-F]+", digits):
                raise ValueError(f"{where}: bad escape \\{e}{digits}")
            out.append(chr(int(digits, 16)))
            i += 2 + _HEX[e]
        elif e in _ESCAPES:
            out.append(_ESCAPES[e])
            i += 2
        else:
            raise ValueError(f"{where}: unknown escape \\{e}")
    return "".join(out)


def _chars(body: str) -> Chars:
    negated = body.startswith("^")
    chars = _unescape_class(body[1:] if negated else body)
    ranges, i = [], 0
    while i < len(chars):
        lo = chars[i]
        if i + 2 < len(chars) and chars[i + 1] == ("-", False):
            hi = chars[i + 2]
            if ord(hi[0]) < ord(lo[0]):
                raise ValueError(f"{WHERE}: bad range [{body}]")
            ranges.append((ord(lo[0]), ord(hi[0])))
            i += 3
        else:
            ranges.append((ord(lo[0]), ord(lo[0])))
            i += 1
    return Chars(tuple(ranges), negated)


def _unescape_class(body: str) -> list[tuple[str, bool]]:
    """The class's characters, each with whether it was escaped (an escaped `-` is a
    character, a bare one between two characters a range)."""
    out, i = [], 0
    while i < len(body):
        if body[i] == "\\":
            n = 2 + _HEX.get(body[i + 1], 0)
            out.append((unescape(body[i : i + n]), True))
            i += n
        else:
            out.append((body[i], False))
            i += 1
    return out
