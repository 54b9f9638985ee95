"""Constraint -> regex -> outlines-core index: the costly part of compiling a grammar.

Kept free of torch so the compile worker process (see compile.py) starts fast and small.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

from outlines_core import Index, Vocabulary

from grammars.constraints import Choices, JsonSchema, Regex
from grammars.vocabulary import TokenVocabulary

# Characters with a meaning in Python's or Rust's regex syntax (outlines-core parses with
# Rust's, whose parser rejects some of Python's re.escape output, e.g. an escaped space).
_META = set("\\.+*?()|[]{}^$#&-~")
_CONTROL = {"\t": r"\t", "\n": r"\n", "\r": r"\r", "\f": r"\f", "\v": r"\v"}


def escape(text: str) -> str:
    """A regex matching exactly `text`, in the syntax both Python and outlines-core read."""
    return "".join("\\" + c if c in _META else _CONTROL.get(c, c) for c in text)


def constraint_regex(constraint: Regex | JsonSchema | Choices) -> str:
    if isinstance(constraint, Regex):
        return constraint.pattern
    if isinstance(constraint, Choices):
        return "|".join(f"({escape(o)})" for o in constraint.options)
    from grammars.json_schema import schema_to_regex

    return schema_to_regex(json.loads(constraint.schema), constraint.whitespace, constraint.strict)


@lru_cache(maxsize=4)
def outlines_vocabulary(vocab: TokenVocabulary) -> Vocabulary:
    """outlines' view of the vocabulary: bytes -> ids (several ids may spell the same bytes).
    It takes one EOS id; the matcher allows the others itself."""
    by_bytes: dict[bytes, list[int]] = {}
    for i, b in enumerate(vocab.token_bytes):
        if b:  # special tokens (None) and empty tokens never advance a grammar
            by_bytes.setdefault(b, []).append(i)
    return Vocabulary(min(vocab.eos_token_ids), by_bytes)


def build_index(pattern: str, vocab: TokenVocabulary) -> Index:
    """The outlines index of `pattern`, with clear errors for bad or unsatisfiable ones."""
    try:
        re.compile(pattern)
    except re.error as e:
        raise ValueError(f"invalid regex {pattern!r}: {e}") from None
    try:
        # outlines-core matches leftmost-first: once an alternative has matched, it drops the
        # lower-priority ones that could still go on ("a|ab" would never reach "ab"). Anchoring
        # the end makes every match wait for the end, so all alternatives stay alive.
        index = Index(f"(?:{pattern})$", outlines_vocabulary(vocab))
    except (ValueError, RuntimeError) as e:
        if "Found no transitions" in str(e):  # outlines' words for a dead end
            raise ValueError(
                f"regex {_short(pattern)} matches nothing this vocabulary can spell"
            ) from None
        raise ValueError(f"regex {_short(pattern)} cannot be compiled: {e}") from None
    if not index.get_allowed_tokens(index.get_initial_state()):
        raise ValueError(f"regex {_short(pattern)} matches nothing this vocabulary can spell")
    return index


def _short(pattern: str) -> str:
    return repr(pattern if len(pattern) <= 200 else pattern[:200] + "...")
