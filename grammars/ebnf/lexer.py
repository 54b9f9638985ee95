"""The terminals of a lark grammar as byte-level automata, and the lexer state over them.

Each terminal's regex becomes an FSM with interegular (over characters). The lexer walks
bytes: it gathers the bytes of one UTF-8 character, then moves every candidate terminal that
can take it. When none can, the longest match has ended: the best candidate at a final
state is emitted (lark's priority, then literal strings over regexes, as lark's lexer
decides keywords) and the character starts the next terminal. Candidates come from the
parser (the terminals it accepts next, plus the ignored ones), as in lark's contextual lexer.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

import interegular

from braid.grammars.regex.char_regex import (
    automaton,
    check_pattern,
    live_states,
    unlisted_transition,
)

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

_LAST_CODE_POINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)  # code points no UTF-8 text holds
_SCALAR_VALUES = _LAST_CODE_POINT + 1 - (_SURROGATES[1] - _SURROGATES[0] + 1)
_LOWEST = {2: 0x80, 3: 0x800, 4: 0x10000}  # a character's least code point, by UTF-8 length

# Code points as sorted (first, last) runs, neither overlapping nor adjacent.
Runs = tuple[tuple[int, int], ...]


@dataclass(frozen=True, eq=False)
class Terminal:
    """A terminal's automaton with what its transitions take in real characters. interegular
    lists the characters a regex names (its alphabet) and sends every other one along the
    transition of its `anything_else` marker; that marker is compared by identity, and a
    terminal pickled back from a compile worker holds a copy of it, so only `other` stands
    for it once the terminal is built."""

    name: str
    fsm: interegular.FSM
    live: frozenset  # states from which real characters reach a final state
    priority: int
    literal: bool  # a string in the grammar (a keyword), not a regex
    shortest: bool  # lazy regex: the match ends at its first final state
    chars: dict[int, Runs]  # per transition, the alphabet's characters on it
    other: int | None  # the transition of the characters outside the alphabet, if any exist
    listed: Runs  # the alphabet's characters and the surrogates: all `other` leaves out

    def transition(self, ch: str) -> int | None:
        """The transition `ch` takes from any state, None if it has none."""
        alphabet = self.fsm.alphabet
        return alphabet[ch] if ch in alphabet else self.other

    def takes_some(self, transition: int, first: int, last: int) -> bool:
        """Whether a character with a code point in [first, last] takes `transition`."""
        if _meets(self.chars.get(transition, ()), first, last):
            return True
        return transition == self.other and not _covers(self.listed, first, last)


def build_terminal(name: str, regex: str, priority: int, literal: bool) -> Terminal:
    """The terminal of `regex`; ValueError naming it where the regex is not supported or can
    match no text (a class that leaves no character, or only surrogates), since such a
    terminal would let the masks into partial characters that nothing completes."""
    if regex == _LARK_ESCAPED_STRING:
        regex = _ESCAPED_STRING
    try:
        check_pattern(regex)
        # Refused before the automaton, which interegular takes half a minute to build for a
        # class that excludes every code point (its alphabet lists them all).
        empty = _matches_nothing(interegular.parse_pattern(regex))
        fsm = None if empty else automaton(regex)[0]
    except ValueError as e:
        raise ValueError(
            f"EBNF terminal {name}: regex /{_shown(regex)}/ cannot be turned into an automaton "
            f"({e}); lookarounds and backreferences are not supported"
        ) from None
    if fsm is not None:
        terminal = _terminal(name, fsm, priority, literal, bool(_LAZY.search(regex)))
        if fsm.initial in terminal.live:
            return terminal
    raise ValueError(
        f"EBNF terminal {name}: regex /{_shown(regex)}/ matches no text: a character class "
        "in it leaves no character to match"
    )


def _shown(regex: str) -> str:
    """`regex` for an error message: characters that do not print (NUL, U+10FFFF, a
    surrogate, which UTF-8 cannot even encode) as their escapes."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in regex)


def _terminal(
    name: str, fsm: interegular.FSM, priority: int, literal: bool, shortest: bool
) -> Terminal:
    chars: dict[int, Runs] = {}
    other, listed = unlisted_transition(fsm), []
    for transition, symbols in fsm.alphabet.by_transition.items():
        points = [ord(s) for s in symbols if isinstance(s, str) and not _surrogate(ord(s))]
        chars[transition] = _runs(points)
        listed += points
    listed += range(_SURROGATES[0], _SURROGATES[1] + 1)
    covered = _runs(listed)
    if _covers(covered, 0, _LAST_CODE_POINT):
        other = None  # every character is listed: "anything else" is none
    real = {t for t, runs in chars.items() if runs} | ({other} - {None})
    # A branch that needs a character no text has is dead: states live along real moves only.
    return Terminal(
        name, fsm, live_states(fsm, real), priority, literal, shortest, chars, other, covered
    )


def _matches_nothing(node) -> bool:
    """Whether a parsed interegular pattern surely matches no text: a class that leaves no
    character, or a sequence, a repeat taken at least once, or an alternation of nothing but
    such. Nodes of other kinds count as matching: the automaton's live states settle them."""
    if hasattr(node, "options"):  # an alternation (the pattern, a group)
        return all(_matches_nothing(option) for option in node.options)
    if hasattr(node, "parts"):  # a sequence
        return any(_matches_nothing(part) for part in node.parts)
    if hasattr(node, "base"):  # a repeat
        return node.min > 0 and _matches_nothing(node.base)
    if hasattr(node, "chars"):  # a class
        listed = sum(1 for c in node.chars if not _surrogate(ord(c)))
        return listed == _SCALAR_VALUES if node.negated else listed == 0
    return False


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
                nxt = term.fsm.map.get(state, {}).get(term.transition(ch))
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
        first, last = _completions(pending)
        return any(term.takes_some(t, first, last) for term, t in self._next_moves(cands))

    def next_chars(self, lex: LexState) -> set[str] | None:
        """The characters some candidate takes next, or None when there are many (a class
        or a negation): what jump-forward needs to see a single forced character."""
        cands, pending, _, _ = lex
        if pending:
            return None
        out: set[str] = set()
        for term, transition in self._next_moves(cands):
            if transition == term.other:
                return None
            for first, last in term.chars.get(transition, ()):
                if last > first:
                    return None
                out.add(chr(first))
            if len(out) > 1:
                return None
        return out

    def _next_moves(self, cands):
        """(terminal, transition) for each live move of each candidate."""
        for t, s in cands:
            term = self.terminals[t]
            if term.shortest and s in term.fsm.finals:
                continue
            for transition, nxt in term.fsm.map.get(s, {}).items():
                if nxt in term.live:
                    yield term, transition


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


def _completions(pending: bytes) -> tuple[int, int]:
    """The first and last code points whose UTF-8 form starts with `pending` (the first bytes
    of a character, as the lexer lets them through)."""
    need = _utf8_length(pending[0])
    value = pending[0] & (0x7F >> need)
    for byte in pending[1:]:
        value = value << 6 | byte & 0x3F
    rest = 6 * (need - len(pending))
    first, last = value << rest, (value << rest) | ((1 << rest) - 1)
    return max(first, _LOWEST[need]), min(last, _LAST_CODE_POINT)


def _surrogate(point: int) -> bool:
    return _SURROGATES[0] <= point <= _SURROGATES[1]


def _runs(points: list[int]) -> Runs:
    runs: list[list[int]] = []
    for point in sorted(points):
        if runs and point <= runs[-1][1] + 1:
            runs[-1][1] = max(runs[-1][1], point)
        else:
            runs.append([point, point])
    return tuple((first, last) for first, last in runs)


def _meets(runs: Runs, first: int, last: int) -> bool:
    """Whether some code point in [first, last] is in `runs`."""
    i = bisect.bisect_right(runs, (last, _LAST_CODE_POINT + 1)) - 1  # the last run from <= last
    return i >= 0 and runs[i][1] >= first


def _covers(runs: Runs, first: int, last: int) -> bool:
    """Whether every code point in [first, last] is in `runs` (one run: they do not touch)."""
    i = bisect.bisect_right(runs, (first, _LAST_CODE_POINT + 1)) - 1
    return i >= 0 and runs[i][1] >= last


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
