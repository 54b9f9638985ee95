"""Stop strings matched across token boundaries, with streaming that never leaks them."""

from __future__ import annotations


class StopStringMatcher:
    """Accumulates generated text; reports when a stop string appears.

    A tail of the text that could still grow into a stop string is held back from the
    stream, so a client never sees half of a stop string completed by a later token.
    """

    def __init__(self, stop_strings: tuple[str, ...]) -> None:
        self.stop_strings = stop_strings
        self.holdback = max((len(s) for s in stop_strings), default=1) - 1
        self.text = ""
        self.emitted = 0
        self.stopped = False

    def add(self, delta: str) -> str:
        """Append new text; return the part that is now safe to stream."""
        search_from = max(len(self.text) - self.holdback, 0)
        self.text += delta
        hits = [i for s in self.stop_strings if (i := self.text.find(s, search_from)) >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True
            return self.flush()
        safe = len(self.text) - self._partial_stop_length()
        if safe <= self.emitted:
            return ""
        out = self.text[self.emitted : safe]
        self.emitted = safe
        return out

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
