"""The grammar every dialect is read into (GBNF, llguidance's lark), and what braid compiles
from it: one regex where no rule recurses (the lazy automaton: the fast path), else a lark
grammar for grammars/ebnf.

Nodes are small frozen values; the dialects' regexes are read into them
(grammars/dialects/python_regex.py), so one set of nodes says everything a grammar holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from braid.grammars.compiling.constraint_regex import escape


@dataclass(frozen=True)
class Lit:
    text: str


@dataclass(frozen=True)
class Chars:
    """One character of these (lo, hi) code point ranges, or with `negated` of none of them."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False


@dataclass(frozen=True)
class Ref:
    name: str


@dataclass(frozen=True)
class Json:
    schema: str  # JSON text; its regex is braid's schema regex


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Rep:
    item: Node
    min: int
    max: int | None  # None: unbounded


Node = Lit | Chars | Ref | Json | Seq | Alt | Rep

# Largest regex the fast path builds by inlining rules; a grammar whose rules are shared so
# much that inlining would pass it compiles as a lark grammar instead.
MAX_INLINED_REGEX = 1 << 20


@dataclass
class Rules:
    """Named rules (lark's rules and terminals alike) and the start rule's name."""

    rules: dict[str, Node]
    start: str
    where: str  # what errors call the grammar (its dialect)
    json_regex: dict[str, str] = field(default_factory=dict)  # schema text -> its regex
    # Rules whose text is bounded in tokens (llguidance's max_tokens inside a grammar): rule
    # name -> tokens. Each is one lexeme; grammars/ebnf counts the tokens in its terminal.
    budgets: dict[str, int] = field(default_factory=dict)

    def check(self) -> None:
        """Every reference names a rule."""
        if self.start not in self.rules:
            raise ValueError(f"{self.where}: no start rule `{self.start}`")
        for name, node in self.rules.items():
            for ref in _refs(node):
                if ref not in self.rules:
                    raise ValueError(f"{self.where}: rule `{name}` uses undefined `{ref}`")

    def json_schemas(self) -> set[str]:
        """The JSON schemas embedded (their regexes go in json_regex before emitting)."""
        found, stack = set(), list(self.rules.values())
        while stack:
            n = stack.pop()
            if isinstance(n, Json):
                found.add(n.schema)
            elif isinstance(n, Seq):
                stack.extend(n.items)
            elif isinstance(n, Alt):
                stack.extend(n.options)
            elif isinstance(n, Rep):
                stack.append(n.item)
        return found

    def recursive(self) -> bool:
        """Whether a rule reaches itself (then the grammar is not regular as written)."""
        state: dict[str, int] = {}  # 1: on the path, 2: done
        for root in self.rules:
            if root in state:
                continue
            stack = [(root, iter(_refs(self.rules[root])))]
            state[root] = 1
            while stack:
                name, refs = stack[-1]
                child = next(refs, None)
                if child is None:
                    state[name] = 2
                    stack.pop()
                elif state.get(child) == 1:
                    return True
                elif child not in state:
                    state[child] = 1
                    stack.append((child, iter(_refs(self.rules[child]))))
        return False

    def regex(self) -> str | None:
        """The grammar as one regex (rules inlined), or None when it recurses or inlining
        would pass MAX_INLINED_REGEX."""
        if self.budgets or self.recursive():
            return None
        done: dict[str, str] = {}
        order = _postorder(self.rules, self.start)
        for name in order:
            done[name] = self._regex(self.rules[name], done)
            if len(done[name]) > MAX_INLINED_REGEX:
                return None
        return done[self.start]

    def _regex(self, node: Node, done: dict[str, str]) -> str:
        if isinstance(node, Lit):
            return escape(node.text)
        if isinstance(node, Chars):
            return _class(node)
        if isinstance(node, Ref):
            return "(?:" + done[node.name] + ")"
        if isinstance(node, Json):
            return "(?:" + self.json_regex[node.schema] + ")"
        if isinstance(node, Seq):
            return "".join(self._regex(i, done) for i in node.items)
        if isinstance(node, Alt):
            return "(?:" + "|".join(self._regex(o, done) for o in node.options) + ")"
        body = "(?:" + self._regex(node.item, done) + ")"
        return body + _count(node.min, node.max)

    def lark(self) -> tuple[str, dict[str, int]]:
        """The grammar as lark text for grammars/ebnf, and the token budgets of its terminals
        (by name): each rule a lark rule, each part free of references one terminal (lark's
        lexer takes no empty terminal: a part that can match nothing becomes an optional
        terminal of what it matches when not empty). A budgeted rule's lexeme is a terminal
        of its own."""
        names = {name: f"r_{i}" for i, name in enumerate(self.rules)}
        names[self.start] = "start"
        terminals: dict[str, str] = {}  # regex -> its terminal's name
        lines, budgets = [], {}
        for name, node in self.rules.items():
            if name in self.budgets:
                lines.append(f"{names[name]}: {self._budgeted(name, node, len(budgets))}")
                budgets[f"B_{len(budgets)}"] = self.budgets[name]
                continue
            lines.append(f"{names[name]}: {self._lark(node, names, terminals)}")
        for regex, terminal in terminals.items():
            lines.append(f"{terminal}: /{_slashes(regex)}/")
        return "\n".join(lines) + "\n", budgets

    def _budgeted(self, name: str, node: Node, i: int) -> str:
        """A budgeted rule's body: its lexeme as terminal B_i, defined on the line after."""
        node = self._inlined(node, (name,))
        if node is None or isinstance(node, Json):
            raise ValueError(
                f"{self.where}: rule `{name}`: max_tokens needs a rule that is one lexeme "
                "(a regex or text, no references)"
            )
        nonempty = _nonempty(node)
        if nonempty is None:
            return "()"
        terminal = f"B_{i}\nB_{i}: /{_slashes(self._regex(nonempty, {}))}/"
        return terminal.replace("\n", "?\n", 1) if _nullable(node) else terminal

    def _inlined(self, node: Node, path: tuple[str, ...]) -> Node | None:
        """`node` with the rules it references written in (None where one recurses)."""
        if isinstance(node, Ref):
            if node.name in path:
                return None
            return self._inlined(self.rules[node.name], (*path, node.name))
        if isinstance(node, (Seq, Alt)):
            parts = [
                self._inlined(n, path)
                for n in (node.items if isinstance(node, Seq) else node.options)
            ]
            if any(p is None for p in parts):
                return None
            return Seq(tuple(parts)) if isinstance(node, Seq) else Alt(tuple(parts))
        if isinstance(node, Rep):
            item = self._inlined(node.item, path)
            return None if item is None else Rep(item, node.min, node.max)
        return node

    def _lark(self, node: Node, names: dict[str, str], terminals: dict[str, str]) -> str:
        if not _refs(node):
            nonempty = _nonempty(node)
            if nonempty is None:
                return "()"
            regex = self._regex(nonempty, {})
            terminal = terminals.setdefault(regex, f"T_{len(terminals)}")
            return f"{terminal}?" if _nullable(node) else terminal
        if isinstance(node, Ref):
            return names[node.name]
        if isinstance(node, Seq):
            return " ".join(self._lark(i, names, terminals) for i in node.items) or "()"
        if isinstance(node, Alt):
            return "(" + " | ".join(self._lark(o, names, terminals) for o in node.options) + ")"
        assert isinstance(node, Rep)
        item = "(" + self._lark(node.item, names, terminals) + ")"
        if node.max is None:
            return f"{item}~{node.min} {item}*" if node.min else f"{item}*"
        return f"{item}~{node.min}..{node.max}" if node.max else "()"


def _count(lo: int, hi: int | None) -> str:
    if hi is None:
        return "*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}"
    if (lo, hi) == (0, 1):
        return "?"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def _class(chars: Chars) -> str:
    """A character class in the syntax Python's re, the lazy automaton and interegular (the
    EBNF lexer's) all read: \\x escapes below 0x100, other characters as themselves."""
    if not chars.ranges:
        return "[\\s\\S]" if chars.negated else "[^\\s\\S]"
    body = "".join(
        _class_char(lo) if lo == hi else f"{_class_char(lo)}-{_class_char(hi)}"
        for lo, hi in sorted(set(chars.ranges))
    )
    return f"[^{body}]" if chars.negated else f"[{body}]"


def _class_char(cp: int) -> str:
    c = chr(cp)
    if cp < 0x100 and (c in "\\]^-[" or not c.isprintable()):
        return f"\\x{cp:02x}"
    return c


def _slashes(regex: str) -> str:
    """A regex inside lark's /.../ (a slash not already escaped is escaped)."""
    out, i = [], 0
    while i < len(regex):
        c = regex[i]
        if c == "\\" and i + 1 < len(regex):
            out.append(regex[i : i + 2])
            i += 2
            continue
        out.append("\\/" if c == "/" else c)
        i += 1
    return "".join(out)


def _refs(node: Node) -> list[str]:
    """The rules `node` references, in order."""
    found, stack = [], [node]
    while stack:
        n = stack.pop()
        if isinstance(n, Ref):
            found.append(n.name)
        elif isinstance(n, Seq):
            stack.extend(reversed(n.items))
        elif isinstance(n, Alt):
            stack.extend(reversed(n.options))
        elif isinstance(n, Rep):
            stack.append(n.item)
    return found


def _postorder(rules: dict[str, Node], start: str) -> list[str]:
    """The rules reachable from `start`, each after those it references (no recursion)."""
    order, seen, stack = [], set(), [(start, False)]
    while stack:
        name, expanded = stack.pop()
        if expanded:
            order.append(name)
            continue
        if name in seen:
            continue
        seen.add(name)
        stack.append((name, True))
        stack.extend((r, False) for r in reversed(_refs(rules[name])) if r not in seen)
    return order


def _nullable(node: Node) -> bool:
    """Whether a reference-free node matches the empty text."""
    if isinstance(node, Lit):
        return node.text == ""
    if isinstance(node, Chars):
        return False
    if isinstance(node, Json):
        return False
    if isinstance(node, Seq):
        return all(_nullable(i) for i in node.items)
    if isinstance(node, Alt):
        return any(_nullable(o) for o in node.options)
    assert isinstance(node, Rep)
    return node.min == 0 or _nullable(node.item)


def _nonempty(node: Node) -> Node | None:
    """A reference-free node matching what `node` matches but the empty text (None: it
    matches only the empty text)."""
    if not _nullable(node):
        return node
    if isinstance(node, Lit):
        return None
    if isinstance(node, Seq):
        # L(x rest) minus "" = x' rest | rest' (x is nullable here, or the Seq would not be)
        if not node.items:
            return None
        first, rest = node.items[0], Seq(node.items[1:])
        options = [o for o in (_seq(_nonempty(first), rest), _nonempty(rest)) if o is not None]
        return Alt(tuple(options)) if len(options) > 1 else (options[0] if options else None)
    if isinstance(node, Alt):
        options = tuple(o for o in map(_nonempty, node.options) if o is not None)
        return Alt(options) if options else None
    assert isinstance(node, Rep)
    item = _nonempty(node.item)
    if item is None or node.max == 0:
        return None
    # One non-empty repetition, then up to max-1 more of any.
    if node.max == 1:
        return item
    more = Rep(node.item, max(node.min - 1, 0), None if node.max is None else node.max - 1)
    return Seq((item, more))


def _seq(first: Node | None, rest: Node) -> Node | None:
    return None if first is None else Seq((first, rest))
