"""llguidance's lark dialect (what guidance 0.3 sends for every select, gen and json), read
into grammar nodes.

    %llguidance {}
    start: "Name: " name ", age " age
    name[capture, max_tokens=8]: NAME
    NAME: /[A-Z][a-z]+/
    age[capture]: %json {"type": "integer"}

Lark's rules and terminals (lexemes) are read alike; `%json {...}` embeds a JSON schema and
`%regex {"substring_chunks": [...]}` the substrings of a text. A rule's attributes: `capture`
names the client's variable (the client reads it back from the text, so it changes nothing
here); `max_tokens` bounds the rule's lexeme in tokens (the reply's max_tokens where the
rule is the whole reply, `start: rule`); `temperature` is taken where the rule is the whole
reply, and `stop` on the start rule's last item, where the reply ends at it and leaves it
out, as llguidance hides it. Anything
else llguidance reads (`%ignore`, imports, token references, subgrammars, lexeme
operators, `lazy`, `suffix`) is refused, naming it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from braid.grammars.dialects.gbnf import unescape
from braid.grammars.dialects.python_regex import regex_node
from braid.grammars.dialects.tree import Alt, Chars, Json, Lit, Node, Ref, Rep, Rules, Seq
from braid.grammars.regex.substrings import substrings_regex

WHERE = "llguidance grammar"
_TOKEN = re.compile(
    r"""
    (?P<newline>\n)
  | (?P<space>[ \t\r]+|//[^\n]*)
  | (?P<directive>%[a-z_]+)
  | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
  | (?P<regex>/(?:[^/\\\n]|\\.)+/[imsux]*)
  | (?P<arrow>->)
  | (?P<range>\.\.)
  | (?P<number>\d+)
  | (?P<name>[?!]?[A-Za-z_][A-Za-z0-9_]*)
  | (?P<attrs>\[(?:"(?:[^"\\\n]|\\.)*"|/(?:[^/\\\n]|\\.)*/|[^\]\n"/])*\](?=\s*:))
  | (?P<op>[()\[\]|?*+:~.])
  | (?P<special><\[[^\]]*\]>|<\|[^|]*\|>|@[A-Za-z_]\w*)
    """,
    re.VERBOSE,
)
_ATTR = re.compile(
    r"""\s*([a-z_]+)\s*(?:=\s*("(?:[^"\\]|\\.)*"|/(?:[^/\\]|\\.)*/|[^,\s]+))?\s*(?:,|$)"""
)
MARKERS = re.compile(r"%llguidance|%json|%regex|^\s*[?!]?\w+(?:\.\d+)?\[[^\]\n]*\]\s*:", re.M)


@dataclass(frozen=True)
class Attributes:
    """A rule's attributes that act on the reply."""

    max_tokens: int | None = None
    temperature: float | None = None
    stop: str | None = None  # a text
    stop_regex: str | None = None


def is_llguidance(text: str) -> bool:
    """Whether lark text uses llguidance's additions (else lark reads it as it is)."""
    return MARKERS.search(text) is not None


def read(text: str) -> tuple[Rules, dict[str, Attributes]]:
    parser = _Parser(_tokens(text))
    rules, attributes = parser.definitions()
    grammar = Rules(rules, "start", WHERE)
    grammar.check()
    _check_placement(grammar, attributes)
    whole = _whole_reply(rules)
    grammar.budgets = {
        name: a.max_tokens
        for name, a in attributes.items()
        if a.max_tokens is not None and name != whole
    }
    return grammar, attributes


def reply_attributes(text: str) -> Attributes:
    """The attributes that act on the whole reply (checked where they stand by `read`): the
    stop of the start rule's last item, and max_tokens and temperature of the rule that is
    the reply (`start: rule`); a max_tokens inside the grammar bounds its own rule only."""
    rules, attributes = _Parser(_tokens(text)).definitions()
    whole = _whole_reply(rules)
    merged: dict = {}
    for name, a in attributes.items():
        for key, value in vars(a).items():
            if value is not None and (name == whole or key in ("stop", "stop_regex")):
                merged[key] = value
    return Attributes(**merged)


def _whole_reply(rules: dict[str, Node]) -> str | None:
    """The rule that is the whole reply (`start: rule`), if one is."""
    start = rules.get("start")
    return start.name if isinstance(start, Ref) else None


def _check_placement(grammar: Rules, attributes: dict[str, Attributes]) -> None:
    start = grammar.rules["start"]
    whole = _whole_reply(grammar.rules)
    last = start.items[-1] if isinstance(start, Seq) else start
    tail = last.name if isinstance(last, Ref) else None
    for name, a in attributes.items():
        uses = sum(_count_refs(node, name) for node in grammar.rules.values())
        if a.temperature is not None and (whole != name or uses > 1):
            raise ValueError(
                f"{WHERE}: rule `{name}`: temperature is supported on the rule that is the "
                f"whole reply (`start: {name}`), not inside a longer grammar"
            )
        if (a.stop is not None or a.stop_regex is not None) and (tail != name or uses > 1):
            raise ValueError(
                f"{WHERE}: rule `{name}`: stop is supported on the start rule's last item only "
                "(where the reply ends at it)"
            )


def _count_refs(node: Node, name: str) -> int:
    if isinstance(node, Ref):
        return int(node.name == name)
    if isinstance(node, Seq):
        return sum(_count_refs(i, name) for i in node.items)
    if isinstance(node, Alt):
        return sum(_count_refs(o, name) for o in node.options)
    if isinstance(node, Rep):
        return _count_refs(node.item, name)
    return 0


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"{WHERE}: unexpected {text[pos : pos + 20]!r} at offset {pos}")
        kind, value = m.lastgroup, m.group()
        pos = m.end()
        if kind == "special":
            raise ValueError(
                f"{WHERE}: {value} (token references and subgrammars) is not supported"
            )
        if kind == "directive":
            if value not in ("%json", "%regex", "%llguidance"):
                raise ValueError(f"{WHERE}: {value} is not supported")
            body, pos = _json_object(text, pos, value)
            if value == "%llguidance":
                if json.loads(body):
                    raise ValueError(f"{WHERE}: %llguidance options {body} are not supported")
                continue
            out.append(("json_embed" if value == "%json" else "substrings", body))
        elif kind != "space":
            out.append((kind, value))
    return out


def _json_object(text: str, pos: int, directive: str) -> tuple[str, int]:
    """The JSON object after a directive, and where it ends."""
    start = len(text) - len(text[pos:].lstrip())
    if not text.startswith("{", start):
        raise ValueError(f"{WHERE}: {directive} needs a JSON object")
    try:
        _, end = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as e:
        raise ValueError(f"{WHERE}: {directive}: invalid JSON: {e}") from None
    return text[start:end], end


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.i = 0

    def peek(self, ahead: int = 0) -> tuple[str, str]:
        j = self.i + ahead
        return self.tokens[j] if j < len(self.tokens) else ("end", "")

    def take(self) -> tuple[str, str]:
        token = self.peek()
        self.i += 1
        return token

    def skip_newlines(self) -> None:
        while self.peek()[0] == "newline":
            self.i += 1

    def definitions(self) -> tuple[dict[str, Node], dict[str, Attributes]]:
        rules: dict[str, Node] = {}
        attributes: dict[str, Attributes] = {}
        self.skip_newlines()
        while self.peek()[0] != "end":
            kind, name = self.take()
            if kind != "name":
                raise ValueError(f"{WHERE}: expected a rule name, got {name!r}")
            name = name.lstrip("?!")
            if self.peek() == ("op", ".") and self.peek(1)[0] == "number":
                self.i += 2  # a priority: the lexer's tie-break, no language of its own
            if self.peek()[0] == "attrs":
                found = _attributes(self.take()[1], name)
                if found != Attributes():
                    attributes[name] = found
            if self.take() != ("op", ":"):
                raise ValueError(f"{WHERE}: expected ':' after {name}")
            if name in rules:
                raise ValueError(f"{WHERE}: rule `{name}` is defined twice")
            rules[name] = self.alternatives()
            if self.peek()[0] not in ("newline", "end"):
                raise ValueError(f"{WHERE}: unexpected {self.peek()[1]!r} in rule `{name}`")
            self.skip_newlines()
        return rules, attributes

    def alternatives(self) -> Node:
        options = [self.sequence()]
        while True:
            j = self.i
            while self.peek()[0] == "newline":
                self.i += 1
            if self.peek() != ("op", "|"):
                self.i = j
                break
            self.i += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self) -> Node:
        items = []
        while self.peek()[0] not in ("newline", "end") and self.peek()[1] not in ("|", ")", "]"):
            if self.peek()[0] == "arrow":  # an alias names the tree node: no language
                self.i += 1
                self.take()
                continue
            items.append(self.postfix(self.atom()))
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def atom(self) -> Node:
        kind, value = self.take()
        if kind == "name":
            return Ref(value.lstrip("?!"))
        if kind == "string":
            text = _string(value)
            if self.peek()[0] == "range":
                self.i += 1
                end_kind, end = self.take()
                high = _string(end) if end_kind == "string" else ""
                if len(text) != 1 or len(high) != 1:
                    raise ValueError(f"{WHERE}: a range needs one character at each end")
                return Chars(((ord(text), ord(high)),))
            if value.endswith("i"):
                return regex_node("(?i:" + re.escape(text) + ")", WHERE)
            return Lit(text)
        if kind == "regex":
            body, _, flags = value[1:].rpartition("/")
            return regex_node((f"(?{flags})" if flags else "") + body, WHERE)
        if kind == "json_embed":
            return Json(json.dumps(json.loads(value), separators=(",", ":")))
        if kind == "substrings":
            return substrings(json.loads(value))
        if (kind, value) == ("op", "("):
            inner = self.alternatives()
            self.close(")")
            return inner
        if (kind, value) == ("op", "["):
            inner = self.alternatives()
            self.close("]")
            return Rep(inner, 0, 1)
        raise ValueError(f"{WHERE}: unexpected {value or 'end'!r}")

    def close(self, bracket: str) -> None:
        if self.take() != ("op", bracket):
            raise ValueError(f"{WHERE}: expected {bracket!r}")

    def postfix(self, node: Node) -> Node:
        while True:
            kind, value = self.peek()
            if value in ("*", "+", "?") and kind == "op":
                self.i += 1
                node = Rep(node, *{"*": (0, None), "+": (1, None), "?": (0, 1)}[value])
            elif (kind, value) == ("op", "~"):
                self.i += 1
                low = self.number()
                high = low
                if self.peek()[0] == "range":
                    self.i += 1
                    high = self.number()
                if high < low:
                    raise ValueError(f"{WHERE}: bad repetition ~{low}..{high}")
                node = Rep(node, low, high)
            else:
                return node

    def number(self) -> int:
        kind, value = self.take()
        if kind != "number":
            raise ValueError(f"{WHERE}: expected a number after ~, got {value!r}")
        return int(value)


def substrings(spec: dict) -> Node:
    """Any run of consecutive chunks of a text (llguidance's `substring_chunks`, `_words` and
    `_chars`: guidance's substring()), the empty one included."""
    if not isinstance(spec, dict) or len(spec) != 1:
        raise ValueError(f"{WHERE}: %regex takes one of substring_chunks, _words, _chars")
    ((key, value),) = spec.items()
    if key == "substring_chunks" and isinstance(value, list):
        chunks = [str(c) for c in value]
    elif key == "substring_words" and isinstance(value, str):
        chunks = re.findall(r"\s+|\S+", value)
    elif key == "substring_chars" and isinstance(value, str):
        chunks = list(value)
    else:
        raise ValueError(f"{WHERE}: %regex {{{key!r}: ...}} is not supported")
    if not chunks:
        return Lit("")
    try:
        return Rep(regex_node(substrings_regex(chunks), WHERE), 0, 1)
    except ValueError as e:
        raise ValueError(f"{WHERE}: %regex {e}") from None


def _string(token: str) -> str:
    return unescape(token.removesuffix("i")[1:-1], WHERE)


def _attributes(text: str, rule: str) -> Attributes:
    found: dict = {}
    body = text[1:-1]
    pos = 0
    while pos < len(body) and body[pos:].strip():
        m = _ATTR.match(body, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"{WHERE}: rule `{rule}`: cannot read attributes {text}")
        key, value = m.group(1), m.group(2)
        pos = m.end()
        if key == "capture":
            continue  # the client's variable: read back from the text by the client
        if key == "max_tokens" and value is not None and value.isdigit():
            found["max_tokens"] = int(value)
        elif key == "temperature" and value is not None:
            found["temperature"] = float(value)
        elif key == "stop" and value is not None and value.startswith('"'):
            if value != '""':
                found["stop"] = unescape(value[1:-1], WHERE)
        elif key == "stop" and value is not None and value.startswith("/"):
            found["stop_regex"] = value[1:-1]
        else:
            raise ValueError(f"{WHERE}: rule `{rule}`: attribute {key} is not supported")
    return Attributes(**found)
