"""Regexes as character automata (interegular's FSM): whether text matches, and whether it
could still grow into a match. EBNF terminals and stop regexes are read this way.

Parsing a pattern is cheap and done where a request is validated (`check_pattern`); building
its automaton can take seconds and gigabytes for counted repetitions (`a{20000}`), so it runs
in the compile worker (grammars/compiling/), under its time and memory limits.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

import interegular

_LOOKAROUND = re.compile(r"(?<!\\)\(\?<?[=!]")


@dataclass(frozen=True)
class CharPattern:
    """A compile job: the automaton of `pattern` over characters (a stop regex)."""

    pattern: str


def check_pattern(pattern: str) -> None:
    """Raise ValueError naming what makes `pattern` unreadable as a character automaton:
    Python syntax errors, lookarounds, and what interegular does not support (anchors,
    backreferences). Cheap: no automaton is built."""
    try:
        re.compile(pattern)
    except re.error as e:
        raise ValueError(f"invalid: {e}") from None
    except RecursionError:
        raise ValueError("invalid: nested too deeply") from None
    if _LOOKAROUND.search(pattern):
        raise ValueError("not supported: lookarounds")
    try:
        interegular.parse_pattern(pattern)
    except RecursionError:
        raise ValueError("not supported: nested too deeply") from None
    except Exception as e:  # interegular raises several kinds for syntax it lacks
        raise ValueError(f"not supported: {type(e).__name__}: {e}") from None


def automaton(pattern: str) -> tuple[interegular.FSM, frozenset]:
    """(the reduced automaton of `pattern`, its live states: those from which a final state
    is reachable). Raises ValueError as `check_pattern` does."""
    check_pattern(pattern)
    try:
        fsm = interegular.parse_pattern(pattern).to_fsm().reduce()
    except RecursionError:
        raise ValueError("not supported: nested too deeply") from None
    except Exception as e:
        raise ValueError(f"not supported: {type(e).__name__}: {e}") from None
    return fsm, live_states(fsm)


def unlisted_transition(fsm: interegular.FSM) -> int | None:
    """The transition of the characters `fsm`'s alphabet does not list (None: it has none).
    interegular marks it with its anything_else object, compared by identity: an automaton
    pickled back from the compile worker holds a copy, so it is found by type, not by
    identity, and read before the automaton is used."""
    for transition, symbols in fsm.alphabet.by_transition.items():
        if not all(isinstance(s, str) for s in symbols):
            return transition
    return None


def live_states(fsm: interegular.FSM, real: set[int] | None = None) -> frozenset:
    """The states from which a final state is reachable (one backward search), along the
    `real` transitions only where given."""
    into: dict[int, list[int]] = defaultdict(list)
    for state, moves in fsm.map.items():
        for transition, nxt in moves.items():
            if real is None or transition in real:
                into[nxt].append(state)
    live, frontier = set(fsm.finals), list(fsm.finals)
    while frontier:
        for before in into[frontier.pop()]:
            if before not in live:
                live.add(before)
                frontier.append(before)
    return frozenset(live)


class CharRegex:
    """A pattern's automaton, stepped one character at a time."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._fsm, self._live = automaton(pattern)
        # Read once: interegular's own lookup of unlisted characters fails on an unpickled
        # automaton (see unlisted_transition), so a negated class (`[^a]+`) took none of them
        # once back from the compile worker.
        self._symbols = self._fsm.alphabet._symbol_mapping
        self._other = unlisted_transition(self._fsm)

    @property
    def initial(self) -> int:
        return self._fsm.initial

    def step(self, state: int, char: str) -> int | None:
        """The state after `char`, or None when no match can follow."""
        nxt = self._fsm.map.get(state, {}).get(self._symbols.get(char, self._other))
        return nxt if nxt in self._live else None

    def accepts(self, state: int) -> bool:
        return state in self._fsm.finals

    def memory_bytes(self) -> int:
        """An estimate: interegular's dicts, ~100 bytes a transition or alphabet entry and
        ~250 a state (its dict and set entries)."""
        fsm = self._fsm
        transitions = sum(len(moves) for moves in fsm.map.values())
        symbols = len(fsm.alphabet._symbol_mapping)
        return 100 * (transitions + symbols) + 250 * len(fsm.map) + len(self.pattern)
