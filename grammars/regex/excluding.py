"""Regexes of free text scanned for words: the text that contains none of them, and the text
that ends where a trigger first occurs (structural tags' any_text and triggered_tags, see
grammars/structural_tag_regex.py). Kept free of torch: the compile worker runs it.

Both come from the words' Aho-Corasick automaton over characters: its states are the trie's
nodes (the longest suffix of the text read that begins a word), and a state is terminal where
some word ends (a word is a suffix of the text read). The text before any word is the walk
through the other states; the automaton becomes a regex by state elimination, deepest states
first. Each state is then entered only from its trie parent and from states as deep or deeper,
so eliminating it leaves edges between shallower states and the regex grows with the words'
length rather than exponentially (MAX_REGEX_CHARS bounds pathological sets all the same).

Characters that occur in no word move every state back to the root, so each edge is a class
of the words' characters, or the complement class `[^...]` on an edge to the root.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from braid.grammars.compiling.constraint_regex import escape

# A regex this long is refused (the lazy automaton's NFA grows with it); words a structural
# tag names (end markers, call triggers) make regexes of a few thousand characters.
MAX_REGEX_CHARS = 200_000

_ATOM = re.compile(r"\\?.|\[(\\.|[^\]\\])*\]", re.DOTALL)


@dataclass(frozen=True)
class Scan:
    """Free text scanned for triggers and excluded words, as regexes.

    `until[t]`: the texts that contain no excluded word and whose first trigger is `t`,
    ending there (the trigger included); `free`: the texts that contain neither."""

    until: dict[str, str]
    free: str


def excluding(words: Iterable[str]) -> str:
    """A regex of every text (newlines included) that contains none of `words`."""
    return scan((), words).free


def scan(triggers: Iterable[str], excluded: Iterable[str]) -> Scan:
    """The Scan of text for `triggers` and `excluded` words (all non-empty). Where words end
    at the same place (one is a suffix of another), an excluded one wins, then the longest
    trigger."""
    # Lists in the order given (not sets): the regex is then the same in every process.
    triggers, excluded = list(dict.fromkeys(triggers)), list(dict.fromkeys(excluded))
    words = [*triggers, *(w for w in excluded if w not in triggers)]
    if any(w == "" for w in words):
        raise ValueError("the words to scan for must not be empty")
    automaton = _Automaton(words)
    finals = {t: -1 - i for i, t in enumerate(triggers)}  # pseudo-states after a trigger
    free = -1 - len(triggers)  # the pseudo-state where free text stops
    edges, order = _edges(automaton, finals, excluded, free)
    loop = _eliminate(edges, order)
    until = {t: _cat(loop, _render(edges[0].get(finals[t]))) for t in triggers}
    return Scan(
        {t: r for t, r in until.items() if r is not None}, _cat(loop, _render(edges[0][free]))
    )


class _Automaton:
    """The words' Aho-Corasick automaton: a trie with, for each node, the words that end at
    it (the node's own and its failure node's) and a full transition over the words'
    characters (other characters go to the root)."""

    def __init__(self, words: list[str]) -> None:
        self.children: list[dict[str, int]] = [{}]
        self.depth = [0]
        own: list[str | None] = [None]
        for word in words:
            node = 0
            for c in word:
                if c not in self.children[node]:
                    self.children[node][c] = len(self.children)
                    self.children.append({})
                    self.depth.append(self.depth[node] + 1)
                    own.append(None)
                node = self.children[node][c]
            own[node] = word
        self.alphabet = sorted({c for w in words for c in w})
        n = len(self.children)
        self.ending: list[list[str]] = [[] for _ in range(n)]  # longest first
        self.delta: list[dict[str, int]] = [{} for _ in range(n)]
        fail = [0] * n
        queue = deque([0])
        while queue:  # breadth first: a node's failure node is shallower, so done before it
            node = queue.popleft()
            self.ending[node] = ([own[node]] if own[node] else []) + (
                self.ending[fail[node]] if node else []
            )
            for c in self.alphabet:
                child = self.children[node].get(c)
                fallback = self.delta[fail[node]][c] if node else 0
                if child is None:
                    self.delta[node][c] = fallback
                else:
                    self.delta[node][c] = child
                    fail[child] = fallback
                    queue.append(child)


def _edges(
    automaton: _Automaton, finals: dict[str, int], excluded: list[str], free: int
) -> tuple[dict[int, dict[int, list[str]]], list[int]]:
    """The automaton's live states (where no word has ended) and hubs (below) with the edges
    between them, each a list of alternative regexes, and the order to eliminate them in:
    deepest first, hubs last. An edge is a state's characters into a live state, into the
    pseudo-state of the trigger they complete, or into none (they complete an excluded
    word); each live state also has an empty edge to `free`.

    A character that starts a word takes most states where it takes the root: to the node of
    that one character. Those edges would join the shallow states into a complete graph,
    whose regex is exponential in their number; so a state's characters that restart the
    scan go by an empty edge to a hub, a pseudo-state whose edges are the root's on those
    characters (one hub per set of them), and the graph is a star around the hubs instead."""
    live = [s for s in range(len(automaton.children)) if not automaton.ending[s]]
    starts = sorted(automaton.children[0])
    delta = automaton.delta
    hubs: dict[tuple[str, ...], int] = {}
    edges: dict[int, dict[int, list[str]]] = {}

    def add(state: int, target: int | None, c: str) -> None:
        if target is not None:  # None: the character completes an excluded word
            edges[state].setdefault(target, []).append(c)

    def target_of(node: int) -> int | None:
        ending = automaton.ending[node]
        if any(w in excluded for w in ending):
            return None
        return finals[ending[0]] if ending else node

    for state in live:
        edges[state] = {}
        restarts = tuple(c for c in starts if state and delta[state][c] == delta[0][c])
        if restarts:
            hub = hubs.setdefault(restarts, len(automaton.children) + len(hubs))
            edges[state][hub] = [""]
        kept = [c for c in automaton.alphabet if c not in restarts and delta[state][c] != 0]
        for c in kept:
            add(state, target_of(delta[state][c]), c)
        edges[state] = {t: [_class(cs)] if cs != [""] else cs for t, cs in edges[state].items()}
        others = "".join(escape(c) for c in [*kept, *restarts])
        edges[state][0] = [f"[^{others}]" if others else r"[\s\S]"]
        edges[state][free] = [""]
    for restarts, hub in hubs.items():
        edges[hub] = {}
        for c in restarts:
            add(hub, target_of(delta[0][c]), c)
        edges[hub] = {t: [_class(cs)] for t, cs in edges[hub].items()}
    order = sorted((s for s in live if s), key=lambda s: -automaton.depth[s])
    return edges, order + list(hubs.values())


def _eliminate(edges: dict[int, dict[int, list[str]]], order: list[int]) -> str:
    """Eliminates every state but the root in `order`, leaving the root's edges to the
    pseudo-states; returns the root's loop as a regex (`(L)*`, or "")."""
    for state in order:
        out = edges.pop(state)
        loop = out.pop(state, None)
        through = _star(loop)
        for source in edges.values():
            into = source.pop(state, None)
            if into is None:
                continue
            head = _cat(_render(into), through)
            for target, regex in out.items():
                _add(source, target, _cat(head, _render(regex)))
    return _star(edges[0].pop(0, None))


def _add(source: dict[int, list[str]], target: int, regex: str) -> None:
    alternatives = source.setdefault(target, [])
    if regex not in alternatives:
        alternatives.append(regex)
    if sum(len(a) for a in alternatives) > MAX_REGEX_CHARS:
        raise ValueError(
            f"the regex of text excluding these words would pass {MAX_REGEX_CHARS} characters"
        )


def _class(chars: list[str]) -> str:
    escaped = "".join(escape(c) for c in chars)
    return escaped if len(chars) == 1 else f"[{escaped}]"


def _render(alternatives: list[str] | None) -> str | None:
    """A list of alternatives as one regex that concatenates safely (None: no path)."""
    if not alternatives:
        return None
    nonempty = [a for a in alternatives if a]
    if not nonempty:
        return ""
    body = nonempty[0] if len(nonempty) == 1 else f"({'|'.join(nonempty)})"
    if len(nonempty) < len(alternatives):  # the empty text is one of them
        return f"{body}?" if _ATOM.fullmatch(body) or len(nonempty) > 1 else f"({body})?"
    return body


def _star(alternatives: list[str] | None) -> str:
    body = _render(alternatives)
    if not body:
        return ""
    return f"{body}*" if _ATOM.fullmatch(body) else f"({body})*"


def _cat(*parts: str | None) -> str | None:
    """Concatenation of regexes that each concatenate safely; None where any is None."""
    if any(p is None for p in parts):
        return None
    return "".join(parts)
