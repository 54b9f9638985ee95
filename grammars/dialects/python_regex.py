"""A Python-syntax regex (lark's terminals, llguidance's lexemes) read into grammar nodes with
Python's own parser, flags applied: `(?s)` and `(?i)` become classes, `\\d`, `\\w` and `\\s`
their ASCII ranges (a subset of Python's Unicode ones: what they allow is always allowed
there). Anchors, lookarounds and backreferences have no automaton and are refused."""

from __future__ import annotations

import re
import re._constants as sre
import re._parser as sre_parse

from braid.grammars.dialects.tree import Alt, Chars, Lit, Node, Rep, Seq

MAX_UNICODE = 0x10FFFF
_CATEGORIES = {
    sre.CATEGORY_DIGIT: ((0x30, 0x39),),
    sre.CATEGORY_WORD: ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)),
    sre.CATEGORY_SPACE: ((0x09, 0x0D), (0x20, 0x20)),
}
_NOT_CATEGORIES = {
    sre.CATEGORY_NOT_DIGIT: sre.CATEGORY_DIGIT,
    sre.CATEGORY_NOT_WORD: sre.CATEGORY_WORD,
    sre.CATEGORY_NOT_SPACE: sre.CATEGORY_SPACE,
}


def regex_node(pattern: str, where: str) -> Node:
    try:
        parsed = sre_parse.parse(pattern)
    except re.error as e:
        raise ValueError(f"{where}: invalid regex /{pattern}/: {e}") from None
    return _Reader(pattern, where).sub(parsed, parsed.state.flags)


class _Reader:
    def __init__(self, pattern: str, where: str) -> None:
        self.pattern = pattern
        self.where = where

    def refuse(self, what: str) -> ValueError:
        return ValueError(
            f"{self.where}: regex /{self.pattern}/ uses {what}, which no automaton has"
        )

    def sub(self, items, flags: int) -> Node:
        nodes = [self.item(op, av, flags) for op, av in items]
        return nodes[0] if len(nodes) == 1 else Seq(tuple(nodes))

    def item(self, op, av, flags: int) -> Node:
        fold = bool(flags & sre.SRE_FLAG_IGNORECASE)
        if op is sre.LITERAL:
            return _folded(((av, av),), False) if fold else Lit(chr(av))
        if op is sre.NOT_LITERAL:
            return _folded(((av, av),), True) if fold else Chars(((av, av),), True)
        if op is sre.ANY:
            return Chars((), True) if flags & sre.SRE_FLAG_DOTALL else Chars(((10, 10),), True)
        if op is sre.IN:
            return self.chars(av, fold)
        if op is sre.BRANCH:
            return Alt(tuple(self.sub(b, flags) for b in av[1]))
        if op is sre.SUBPATTERN:
            _, add, remove, inner = av
            return self.sub(inner, (flags | add) & ~remove)
        if op is sre.ATOMIC_GROUP:
            return self.sub(av, flags)
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            lo, hi, inner = av
            return Rep(self.sub(inner, flags), lo, None if hi is sre.MAXREPEAT else hi)
        if op is sre.AT:
            raise self.refuse("an anchor")
        if op in (sre.ASSERT, sre.ASSERT_NOT):
            raise self.refuse("a lookaround")
        if op in (sre.GROUPREF, sre.GROUPREF_EXISTS):
            raise self.refuse("a backreference")
        raise self.refuse(str(op))

    def chars(self, items, fold: bool) -> Node:
        negated, ranges = False, []
        for op, av in items:
            if op is sre.NEGATE:
                negated = True
            elif op is sre.LITERAL:
                ranges.append((av, av))
            elif op is sre.RANGE:
                ranges.append(av)
            elif op is sre.CATEGORY and av in _CATEGORIES:
                ranges.extend(_CATEGORIES[av])
            elif op is sre.CATEGORY and av in _NOT_CATEGORIES and len(items) == 1:
                return Chars(_CATEGORIES[_NOT_CATEGORIES[av]], True)
            else:
                raise self.refuse(f"the class item {op} {av}")
        return _folded(tuple(ranges), negated) if fold else Chars(tuple(ranges), negated)


def _folded(ranges: tuple[tuple[int, int], ...], negated: bool) -> Chars:
    """A class with both cases of its ASCII letters (what (?i) means for them)."""
    more = list(ranges)
    for lo, hi in ranges:
        for a, b, shift in ((0x41, 0x5A, 32), (0x61, 0x7A, -32)):
            x, y = max(lo, a), min(hi, b)
            if x <= y:
                more.append((x + shift, y + shift))
    return Chars(tuple(more), negated)
