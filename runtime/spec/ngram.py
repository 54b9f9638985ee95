"""Prompt-lookup drafts: continuations of the request's last n tokens found earlier in its own
prompt and output (extraction, quoting and code edits copy long runs of their input)."""

from __future__ import annotations

# Match lengths tried, longest first: a longer match predicts its continuation better. One
# token is too weak a match: in free text it proposes mostly wrong continuations (after
# " the", say), and a copy resumes one token later with a two-token match anyway.
MAX_NGRAM, MIN_NGRAM = 4, 2
# Occurrences of one n-gram looked at, most recent first (a frequent token recurs hundreds of
# times in a long prompt, mostly with continuations already collected).
MAX_OCCURRENCES = 32


class NgramIndex:
    """Where each n-gram (n in MIN_NGRAM..MAX_NGRAM) of one request's tokens ends, updated
    incrementally as tokens are appended (tokens are never changed once written)."""

    def __init__(self) -> None:
        self._ends: dict[tuple[int, ...], list[int]] = {}
        self._indexed = 0  # tokens[:_indexed] are in the table

    def _update(self, tokens: list[int]) -> None:
        for end in range(self._indexed + 1, len(tokens) + 1):
            for n in range(MIN_NGRAM, min(MAX_NGRAM, end) + 1):
                self._ends.setdefault(tuple(tokens[end - n : end]), []).append(end)
        self._indexed = len(tokens)

    def propose(self, tokens: list[int], length: int, width: int) -> list[list[int]]:
        """Up to `width` distinct continuations of `tokens`, each at most `length` long.

        Longer matches come first and, within one n, the most recent occurrence. When the
        match overlaps the end (the text repeats itself), the continuation repeats with the
        same period.
        """
        self._update(tokens)
        total = len(tokens)
        paths: list[list[int]] = []
        for n in range(min(MAX_NGRAM, total - 1), MIN_NGRAM - 1, -1):
            ends = self._ends.get(tuple(tokens[total - n :]), [])
            for end in reversed(ends[-MAX_OCCURRENCES:]):
                if end >= total:
                    continue  # the suffix itself
                period = total - end
                path = [tokens[end + i % period] for i in range(length)]
                if path not in paths:  # every path is `length` tokens long
                    paths.append(path)
                    if len(paths) == width:
                        return paths
        return paths
