"""Stop strings and stop regexes matched across token boundaries, with streaming that never
leaks them."""

from __future__ import annotations

from collections.abc import Sequence

from braid.grammars.regex.char_regex import CharRegex


class StopMatcher:
    """Accumulates generated text; reports when a stop string or stop regex appears.

    The output ends before the earliest stop found. A tail of the text that could still grow
    into a stop is held back from the stream, so a client never sees part of a stop completed
    by a later token.
    """

    def __init__(
        self, stop_strings: tuple[str, ...], stop_regexes: Sequence[CharRegex] = ()
    ) -> None:
        self.stop_strings = stop_strings
        self.holdback = max((len(s) for s in stop_strings), default=1) - 1
        self.regexes = stop_regexes
        # Per regex: start position -> automaton state of the partial matches still alive,
        # the earliest start kept per state (later starts in the same state add nothing).
        self._partials: list[dict[int, int]] = [{} for _ in self.regexes]
        self.text = ""
        self.emitted = 0
        self.stopped = False

    def add(self, delta: str) -> str:
        """Append new text; return the part that is now safe to stream."""
        if not self.stop_strings and not self.regexes:
            return delta  # nothing to match or hold back, nothing to keep
        search_from = max(len(self.text) - self.holdback, 0)
        start = len(self.text)
        self.text += delta
        hits = [i for s in self.stop_strings if (i := self.text.find(s, search_from)) >= 0]
        hits += self._regex_hits(start)
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True
            return self.flush()
        safe = len(self.text) - self._partial_stop_length()
        safe = min([safe] + [min(p) for p in self._partials if p])
        if safe <= self.emitted:
            return ""
        out = self.text[self.emitted : safe]
        self.emitted = safe
        return out

    def _regex_hits(self, start: int) -> list[int]:
        """Advance every regex over text[start:]; the starts of the first matches found."""
        if not self.regexes:
            return []
        for pos in range(start, len(self.text)):
            char = self.text[pos]
            hits = []
            for i, regex in enumerate(self.regexes):
                self._partials[i][pos] = regex.initial  # starts stay in ascending order
                advanced: dict[int, int] = {}
                reached: set[int] = set()
                for begin, state in self._partials[i].items():
                    nxt = regex.step(state, char)
                    if nxt is None or nxt in reached:
                        continue
                    if regex.accepts(nxt):
                        hits.append(begin)
                    advanced[begin] = nxt
                    reached.add(nxt)
                self._partials[i] = advanced
            if hits:
                return hits
        return []

    def _partial_stop_length(self) -> int:
        """Length of the longest tail of the text that begins some stop string."""
        for k in range(min(self.holdback, len(self.text)), 0, -1):
            tail = self.text[-k:]
            if any(s.startswith(tail) for s in self.stop_strings):
                return k
        return 0

    def flush(self) -> str:
        """Everything not yet streamed (call when the request ends)."""
        out = self.text[self.emitted :]
        self.emitted = len(self.text)
        return out
