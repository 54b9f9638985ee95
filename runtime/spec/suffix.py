"""Suffix-decoding drafts: continuations of a request's last tokens found in EARLIER requests'
token sequences of the same scope (a program, tenant or conversation). Agent loops and repeated
extractions regenerate long runs of what earlier requests produced, which the request's own
tokens (ngram.py) have not seen yet.

Index: per scope, a hash map from the hash of an n-gram, for n in INDEXED_LENGTHS (MIN_MATCH
doubling up to MAX_MATCH), to the most recent MAX_OCCURRENCES places it ends. The longest
matching suffix is found by probing the longest indexed n first and measuring, token by token,
how far back each of its occurrences agrees with the context (which also drops hash
collisions): every occurrence of the longest match m (n <= m < 2n) is in the n-gram's list,
unless MAX_OCCURRENCES newer occurrences of the n-gram pushed it out.

Cost, independent of how many tokens are stored:
- add/extend: O(MAX_MATCH) per new token (slicing and hashing its 4 indexed n-grams);
- remove/eviction: O(len(INDEXED_LENGTHS) * MAX_OCCURRENCES) per removed token;
- propose: O(len(INDEXED_LENGTHS) * MAX_OCCURRENCES * (MAX_MATCH + length)) at worst.
Memory per stored token: the token, plus at most len(INDEXED_LENGTHS) = 4 occurrences (one int
each) and, for n-grams seen nowhere else, their keys and lists: 0.5-0.75 KB in all (measured,
CPython 3.11).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

# Longest and shortest suffix matched. One token is too weak a match (see ngram.py); beyond 16
# tokens a longer match barely changes which continuation is likely.
MAX_MATCH, MIN_MATCH = 16, 2
# MIN_MATCH doubling up to MAX_MATCH: any match length m has an indexed n <= m < 2n.
INDEXED_LENGTHS = (2, 4, 8, 16)
# Occurrences kept per n-gram, oldest dropped first: bounds a frequent n-gram's cost, and the
# recent ones say best how the scope's requests continue it now.
MAX_OCCURRENCES = 64
# An occurrence is one int: its sequence's id above these bits, the position it ends at below.
_END_BITS = 32
_END_MASK = (1 << _END_BITS) - 1


@dataclass(slots=True)
class _Sequence:
    """One stored request's tokens (prompt and output, as the caller adds them) and its scope."""

    scope: Hashable
    tokens: list[int]


def _match_length(tokens: list[int], end: int, context: list[int]) -> int:
    """How many tokens before `end` in `tokens` equal the last ones of `context` (<= MAX_MATCH)."""
    limit = min(MAX_MATCH, end, len(context))
    n = 0
    while n < limit and tokens[end - 1 - n] == context[-1 - n]:
        n += 1
    return n


class SuffixStore:
    """Engine-wide token sequences of finished and running requests, grouped by scope, with
    their n-gram index. Holds at most `max_tokens` tokens, evicting whole least-recently-used
    sequences (added, extended or matched by a proposal) across all scopes."""

    def __init__(self, max_tokens: int = 1 << 20) -> None:
        self.max_tokens = max_tokens
        self._sequences: OrderedDict[int, _Sequence] = OrderedDict()  # least recently used first
        self._ends: dict[Hashable, dict[int, list[int]]] = {}  # scope -> n-gram hash -> occurrences
        self._total = 0  # tokens in all sequences
        self._next_id = 0

    def __len__(self) -> int:
        """Tokens stored."""
        return self._total

    def add(self, scope: Hashable, tokens: list[int]) -> int:
        """Store a copy of `tokens` under `scope`; returns its id for extend and remove."""
        seq_id = self._next_id
        self._next_id += 1
        self._sequences[seq_id] = _Sequence(scope, [])
        self.extend(seq_id, tokens)
        return seq_id

    def extend(self, seq_id: int, new_tokens: list[int]) -> None:
        """Append to a stored sequence (a running request's output grows). An evicted id is
        ignored: eviction is the store's business, and callers need not track it."""
        seq = self._sequences.get(seq_id)
        if seq is None:
            return
        self._sequences.move_to_end(seq_id)
        tokens = seq.tokens
        start = len(tokens)
        tokens.extend(new_tokens)
        self._total += len(new_tokens)
        index = self._ends.setdefault(seq.scope, {})
        for end in range(start + 1, len(tokens) + 1):
            occurrence = seq_id << _END_BITS | end
            for n in INDEXED_LENGTHS:
                if n > end:
                    break
                ends = index.setdefault(hash(tuple(tokens[end - n : end])), [])
                ends.append(occurrence)
                if len(ends) > MAX_OCCURRENCES:
                    del ends[0]
        while self._total > self.max_tokens:
            self.remove(next(iter(self._sequences)))

    def remove(self, seq_id: int) -> None:
        """Forget a stored sequence and its index entries (an evicted id is ignored)."""
        seq = self._sequences.pop(seq_id, None)
        if seq is None:
            return
        tokens = seq.tokens
        self._total -= len(tokens)
        # Newer occurrences may have pushed all of this sequence's out of a list, and removals
        # of those may have dropped the list (or the scope's whole index) since.
        index = self._ends.get(seq.scope, {})
        for end in range(1, len(tokens) + 1):
            occurrence = seq_id << _END_BITS | end
            for n in INDEXED_LENGTHS:
                if n > end:
                    break
                key = hash(tuple(tokens[end - n : end]))
                ends = index.get(key, [])
                if occurrence in ends:
                    ends.remove(occurrence)
                    if not ends:
                        del index[key]
        if not index:
            self._ends.pop(seq.scope, None)

    def propose(
        self, scope: Hashable, context: list[int], length: int, width: int
    ) -> list[list[int]]:
        """Up to `width` distinct continuations (1 to `length` tokens; one stops where its
        stored sequence ends) of the longest suffix of `context`, MIN_MATCH to MAX_MATCH tokens,
        that occurs in `scope`'s sequences followed by at least one token.

        Best first: the continuation that most often followed the suffix, ties going to the
        one that followed it most recently. One that is a prefix of a continuation already
        chosen is skipped: a draft tree holds its tokens already.
        """
        index = self._ends.get(scope)
        if index is None or length < 1 or width < 1:
            return []
        for n in reversed(INDEXED_LENGTHS):
            if n > len(context):
                continue
            longest = n  # an occurrence agreeing on fewer tokens is a hash collision
            # (seq_id, end) of the occurrences agreeing on `longest` tokens, oldest first.
            matches: list[tuple[int, int]] = []
            for occurrence in index.get(hash(tuple(context[-n:])), ()):
                seq_id, end = occurrence >> _END_BITS, occurrence & _END_MASK
                tokens = self._sequences[seq_id].tokens
                if end == len(tokens):
                    continue  # nothing follows (yet)
                agreed = _match_length(tokens, end, context)
                if agreed > longest:
                    longest, matches = agreed, []
                if agreed == longest:
                    matches.append((seq_id, end))
            if matches:
                return self._rank(matches, length, width)
        return []

    def _rank(self, matches: list[tuple[int, int]], length: int, width: int) -> list[list[int]]:
        """The continuations after `matches` (oldest first), ranked as propose says."""
        count: dict[tuple[int, ...], int] = {}
        latest: dict[tuple[int, ...], int] = {}  # continuation -> its latest match's index
        for i, (seq_id, end) in enumerate(matches):
            continuation = tuple(self._sequences[seq_id].tokens[end : end + length])
            count[continuation] = count.get(continuation, 0) + 1
            latest[continuation] = i
            self._sequences.move_to_end(seq_id)
        paths: list[list[int]] = []
        for continuation in sorted(count, key=lambda c: (count[c], latest[c]), reverse=True):
            path = list(continuation)
            if not any(chosen[: len(path)] == path for chosen in paths):
                paths.append(path)
                if len(paths) == width:
                    break
        return paths
