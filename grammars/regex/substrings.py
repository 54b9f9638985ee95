"""The regex of every non-empty run of a text's chunks, in order (braid's substring() and
llguidance's `%regex {"substring_...": ...}`)."""

from __future__ import annotations

import math

from braid.grammars.compiling.constraint_regex import escape

# The regex grows as chunks^1.5 (see _blocks_regex): 1024 chunks (about 500 words) make
# 330,000 characters, which the lazy automaton compiles in 0.1 s and Python's re, for a
# grammar with captures, in about 2 s (4,000 chunks would take 30 s).
MAX_SUBSTRING_CHUNKS = 1024


def substrings_regex(chunks: list[str]) -> str:
    """Any non-empty run of `chunks` (texts), in order."""
    if not chunks:
        raise ValueError("substrings of no chunks")
    if len(chunks) > MAX_SUBSTRING_CHUNKS:
        raise ValueError(
            f"substrings of {len(chunks)} chunks; at most {MAX_SUBSTRING_CHUNKS} are supported"
        )
    return _blocks_regex([escape(c) for c in chunks])


def _blocks_regex(units: list[str]) -> str:
    """A regex of every non-empty run of `units` (regexes of one chunk each), of
    O(n^1.5) characters nesting O(n^0.5) deep, for n units.

    The plain way, for each start the prefixes of the rest `u_i(?:u_i+1(?:...)?)?`, costs n^2
    and nests n deep (Python's parser recurses per level). Here the units are cut into
    blocks of D = sqrt(n). A run starting in block b either ends in it (the prefixes of the
    block's rest from the start: D^2 per block), or takes the block's rest (one of D
    literals) and goes on with `after[b]`, the non-empty prefixes of everything past block
    b, written once for all the block's starts: the prefixes of block b + 1, or all of it
    followed by after[b + 1].
    """
    size = max(1, math.isqrt(len(units)))
    blocks = [units[i : i + size] for i in range(0, len(units), size)]
    after = [""] * len(blocks)  # after[b]: prefixes of the units past block b
    for b in range(len(blocks) - 2, -1, -1):
        nxt = blocks[b + 1]
        tail = f"|{''.join(nxt)}{after[b + 1]}" if after[b + 1] else ""
        after[b] = f"(?:{_prefixes(nxt)}{tail})"
    runs = []
    for b, block in enumerate(blocks):
        runs += (_prefixes(block[i:]) for i in range(len(block)))
        if after[b]:
            runs.append("(?:" + "|".join("".join(block[i:]) for i in range(len(block))) + ")")
            runs[-1] += after[b]
    return "|".join(runs)


def _prefixes(units: list[str]) -> str:
    """The non-empty prefixes of `units` joined: u0(?:u1(?:u2)?)?"""
    out = units[-1]
    for unit in reversed(units[:-1]):
        out = f"{unit}(?:{out})?"
    return out
