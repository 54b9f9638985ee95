"""Prompt-lookup drafts: continuations of the request's last n tokens found earlier in its own
prompt and output (extraction, quoting and code edits copy long runs of their input)."""

from __future__ import annotations

# Match lengths tried, longest first: a longer match predicts its continuation better. One
# token is too weak a match: in free text it proposes mostly wrong continuations (after
# " the", say), and a copy resumes one token later with a two-token match anyway.
MAX_NGRAM, MIN_NGRAM = 4, 2
# How far back an occurrence's agreement with the last tokens is measured, to rank them.
MAX_MATCH = 32
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

        Longer matches come first: an occurrence's match is measured back from the n-gram,
        up to MAX_MATCH tokens (in code a 4-gram such as "    return self." recurs all over
        a file; the occurrence that agrees furthest back is the one being copied), then the
        most recent. When the match overlaps the end (the text repeats itself), the
        continuation repeats with the same period.
        """
        self._update(tokens)
        total = len(tokens)
        paths: list[list[int]] = []
        for n in range(min(MAX_NGRAM, total - 1), MIN_NGRAM - 1, -1):
            # Ends grow with the tokens: only the last can be the suffix itself.
            ends = self._ends.get(tuple(tokens[total - n :]), [])[-MAX_OCCURRENCES - 1 :]
            recent = [e for e in ends if e < total][-MAX_OCCURRENCES:]
            order = sorted(
                range(len(recent)),
                key=lambda i: (_match_length(tokens, recent[i], n), i),
                reverse=True,
            )
            for i in order:
                end = recent[i]
                period = total - end
                path = [tokens[end + j % period] for j in range(length)]
                if path not in paths:  # every path is `length` tokens long
                    paths.append(path)
                    if len(paths) == width:
                        return paths
        return paths


def _match_length(tokens: list[int], end: int, known: int) -> int:
    """How many tokens before `end` agree with the last ones of `tokens` (at least `known`,
    at most MAX_MATCH)."""
    total, n = len(tokens), known
    limit = min(MAX_MATCH, end)
    while n < limit and tokens[end - 1 - n] == tokens[total - 1 - n]:
        n += 1
    return n
