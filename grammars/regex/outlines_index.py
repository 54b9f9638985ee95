"""A regex's outlines-core index: every DFA state's allowed tokens, built up front.

It costs states x vocabulary to build and keep, so it is built only where the lazy automaton
(grammars/regex/lazy.py) cannot serve, and only for regexes `fits_index` finds small enough. Kept
free of torch: the compile worker process (see jobs.py) builds it.
"""

from __future__ import annotations

import re

from outlines_core import Index, Vocabulary

from braid.grammars.compiling.constraint_regex import short
from braid.grammars.vocabulary import TokenVocabulary, per_vocabulary

# Past these an outlines index takes seconds and gigabytes: a long regex means many states,
# and each counted repetition ({m,n}) one state per count, most allowing nearly the whole
# vocabulary (a string's plain characters).
INDEX_REGEX_CHARS = 100_000
INDEX_COUNTED = 512
_COUNTS = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")
_SMALL_COUNT = 16  # {2,4}-sized counts (dates, hex digits) are cheap


def fits_index(pattern: str) -> bool:
    """Whether an outlines index of `pattern` is cheap enough to build up front."""
    if len(pattern) > INDEX_REGEX_CHARS or "(?=" in pattern:  # length lookaheads: lazy only
        return False
    counts = (max(int(lo), int(hi or 0)) for lo, hi in _COUNTS.findall(pattern))
    return sum(c for c in counts if c > _SMALL_COUNT) <= INDEX_COUNTED


@per_vocabulary
def outlines_vocabulary(vocab: TokenVocabulary) -> Vocabulary:
    """outlines' view of the vocabulary: bytes -> ids (several ids may spell the same bytes).
    It takes one EOS id; the matcher allows the others itself."""
    by_bytes: dict[bytes, list[int]] = {}
    for i, b in enumerate(vocab.token_bytes):
        if b:  # special tokens (None) and empty tokens never advance a grammar
            by_bytes.setdefault(b, []).append(i)
    return Vocabulary(min(vocab.eos_token_ids), by_bytes)


class IndexUnbuildable(ValueError):
    """outlines-core could not build the regex's automaton (its size or nesting limits):
    the lazy automaton may still take the regex."""


def build_index(pattern: str, vocab: TokenVocabulary) -> Index:
    """The outlines index of `pattern`, with clear errors for bad or unsatisfiable ones."""
    try:
        # outlines-core matches leftmost-first: once an alternative has matched, it drops the
        # lower-priority ones that could still go on ("a|ab" would never reach "ab"). Anchoring
        # the end makes every match wait for the end, so all alternatives stay alive.
        index = Index(f"(?:{pattern})$", outlines_vocabulary(vocab))
    except (ValueError, RuntimeError) as e:
        if "Found no transitions" in str(e):  # outlines' words for a dead end
            raise ValueError(
                f"regex {short(pattern)} matches nothing this vocabulary can spell"
            ) from None
        raise IndexUnbuildable(f"regex {short(pattern)} cannot be compiled: {e}") from None
    if not index.get_allowed_tokens(index.get_initial_state()):
        raise ValueError(f"regex {short(pattern)} matches nothing this vocabulary can spell")
    return index
