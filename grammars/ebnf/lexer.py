"""The terminals of a lark grammar as byte-level automata, and the lexer state over them.

Each terminal's regex becomes an FSM with interegular (over characters). The lexer walks
bytes: it gathers the bytes of one UTF-8 character, then moves every candidate terminal that
can take it. When none can, the longest match has ended: the best candidate at a final
state is emitted (lark's priority, then literal strings over regexes, as lark's lexer
decides keywords) and the character starts the next terminal. Candidates come from the
parser (the terminals it accepts next, plus the ignored ones), as in lark's contextual lexer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import interegular
from interegular.fsm import anything_else

from braid.grammars.regex.char_regex import automaton

# lark's common.ESCAPED_STRING matches lazily up to a quote not preceded by an odd run of
# backslashes, with a lookbehind interegular cannot build; this is the same language.
_LARK_ESCAPED_STRING = '".*?(?<!\\\\)(\\\\\\\\)*?"'
_ESCAPED_STRING = r'"([^"\\\n]|\\[^\n])*"'
_LAZY = re.compile(r"(?<!\\)[*+?}]\?")

# Lexer states are plain tuples so that they hash fast and cache well:
# (candidates: tuple[(terminal, fsm state)], pending bytes of a character, fresh, restart)
# `fresh`: no character of the current terminal has been read (nothing to emit yet).
# `restart`: the terminals a fresh state holds at this parser position; an ignored terminal
# (whitespace, comments) ends without moving the parser, so the lexer restarts from these.
LexState = tuple[tuple[tuple[int, int], ...], bytes, bool, frozenset]

DEAD, CONTINUE, EMIT = 0, 1, 2


@dataclass(frozen=True)
class Terminal:
    name: str
    fsm: interegular.FSM
    live: frozenset  # states from which a final state is reachable
    priority: int
    literal: bool  # a string in the grammar (a keyword), not a regex
    shortest: bool  # lazy regex: the match ends at its first final state


def build_terminal(name: str, regex: str, priority: int, literal: bool) -> Terminal:
    if regex == _LARK_ESCAPED_STRING:
        regex = _ESCAPED_STRING
    try:
        fsm, live = automaton(regex)
    except ValueError as e:
        raise ValueError(
            f"EBNF terminal {name}: regex /{regex}/ cannot be turned into an automaton ({e}); "
            "lookarounds and backreferences are not supported"
        ) from None
    return Terminal(name, fsm, live, priority, literal, bool(_LAZY.search(regex)))


class Lexer:
    """Character and byte steps over a fixed list of terminals, memoized."""

    def __init__(self, terminals: list[Terminal], ignore: frozenset[int]) -> None:
        self.terminals = terminals
        self.ignore = ignore
        self._char_steps: dict[tuple[int, int, str], int | None] = {}
        self._byte_steps: dict[tuple[LexState, int], tuple] = {}

    def memo_entries(self) -> int:
        """Steps memoized so far (for the grammar's memory estimate)."""
        return len(self._char_steps) + len(self._byte_steps)

    def fresh(self, accepted: frozenset[int]) -> LexState:
        """The state before a terminal the parser accepts (or an ignored one) starts."""
        restart = accepted | self.ignore
        cands = tuple(sorted((t, self.terminals[t].fsm.initial) for t in restart))
        return (cands, b"", True, restart)

    def _move(self, t: int, state: int, ch: str) -> int | None:
        key = (t, state, ch)
        if key not in self._char_steps:
            term = self.terminals[t]
            nxt = None
            if not (term.shortest and state in term.fsm.finals):
                symbol = term.fsm.alphabet[ch]
                nxt = term.fsm.map.get(state, {}).get(symbol)
                nxt = nxt if nxt in term.live else None
            self._char_steps[key] = nxt
        return self._char_steps[key]

    def step_char(self, lex: LexState, ch: str) -> tuple:
        """(CONTINUE, new state) | (EMIT, terminal id) | (DEAD,). On EMIT the caller feeds
        the terminal to the parser and steps `ch` from the fresh state that follows."""
        cands, _, fresh, restart = lex
        moved = tuple((t, nxt) for t, s in cands if (nxt := self._move(t, s, ch)) is not None)
        if moved:
            return CONTINUE, (moved, b"", False, restart)
        best = None if fresh else self.best_final(lex)
        if best is None:
            return (DEAD,)
        if best in self.ignore:
            cands = tuple(sorted((t, self.terminals[t].fsm.initial) for t in restart))
            return self.step_char((cands, b"", True, restart), ch)
        return EMIT, best

    def step_byte(self, lex: LexState, byte: int) -> tuple:
        """Like step_char, with (EMIT, terminal, char) since a character spans bytes."""
        key = (lex, byte)
        hit = self._byte_steps.get(key)
        if hit is None:
            hit = self._step_byte(lex, byte)
            self._byte_steps[key] = hit
        return hit

    def _step_byte(self, lex: LexState, byte: int) -> tuple:
        cands, pending, fresh, restart = lex
        buf = pending + bytes((byte,))
        need = _utf8_length(buf[0])
        if need == 0 or (len(buf) > 1 and not _continues(buf)):
            return (DEAD,)
        if len(buf) < need:
            return CONTINUE, (cands, buf, fresh, restart)
        try:
            ch = buf.decode("utf-8")
        except UnicodeDecodeError:  # overlong forms, surrogates
            return (DEAD,)
        result = self.step_char((cands, b"", fresh, restart), ch)
        return (EMIT, result[1], ch) if result[0] == EMIT else result

    def best_final(self, lex: LexState) -> int | None:
        """The terminal emitted if the match ends here: highest priority, then a literal."""
        cands, pending, _, _ = lex
        if pending:
            return None
        finals = [t for t, s in cands if s in self.terminals[t].fsm.finals]
        if not finals:
            return None
        terms = self.terminals
        return min(finals, key=lambda t: (-terms[t].priority, not terms[t].literal, t))

    def may_complete(self, lex: LexState) -> bool:
        """Can the pending bytes of a character be completed into one some candidate takes?
        (Tokens that end inside a character are allowed only then.)"""
        cands, pending, _, _ = lex
        if not pending:
            return True
        return any(
            c is anything_else or c.encode()[: len(pending)] == pending
            for chars in self._next_char_sets(cands)
            for c in chars
        )

    def next_chars(self, lex: LexState) -> set[str] | None:
        """The characters some candidate takes next, or None when there are many (a class
        or a negation): what jump-forward needs to see a single forced character."""
        cands, pending, _, _ = lex
        if pending:
            return None
        out: set[str] = set()
        for chars in self._next_char_sets(cands):
            if anything_else in chars:
                return None
            out.update(chars)
            if len(out) > 1:
                return None
        return out

    def _next_char_sets(self, cands):
        """For each live move of each candidate, the characters that take it."""
        for t, s in cands:
            term = self.terminals[t]
            if term.shortest and s in term.fsm.finals:
                continue
            moves = term.fsm.map.get(s, {})
            for symbol, chars in term.fsm.alphabet.by_transition.items():
                if moves.get(symbol) in term.live:
                    yield chars


# The second byte's range for the lead bytes that narrow it (UTF-8 has no overlong forms,
# surrogates or code points past U+10FFFF): a token ending in a prefix no character has would
# be let through the mask and leave the output at a dead end.
_SECOND_BYTE = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}


def _continues(buf: bytes) -> bool:
    """Whether the last byte of `buf` (a character's lead byte and what follows it) can
    continue a UTF-8 character."""
    byte = buf[-1]
    if len(buf) == 2:
        low, high = _SECOND_BYTE.get(buf[0], (0x80, 0xBF))
        return low <= byte <= high
    return byte & 0xC0 == 0x80


def _utf8_length(lead: int) -> int:
    if lead < 0x80:
        return 1
    if 0xC2 <= lead < 0xE0:
        return 2
    if 0xE0 <= lead < 0xF0:
        return 3
    if 0xF0 <= lead < 0xF5:
        return 4
    return 0
