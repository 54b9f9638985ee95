"""The pieces of JSON text every keyword family writes: a string character, a string, the
literals, a value as compact JSON, and the alternation of converted options."""

from __future__ import annotations

import json
from typing import Any

# One JSON string character, exactly one code point each (surrogate escapes excluded so
# a pattern's counted repetitions count code points the way validators do).
CHAR = (
    r'([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u([0-9a-ce-fA-CE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}))'
)
STRING = f'"{CHAR}*"'
BOOLEAN = "(true|false)"
NULL = "null"


def alternatives(options: list[str | None]) -> str | None:
    """Any one of the options; None (no value) where every option is None."""
    kept = list(dict.fromkeys(o for o in options if o is not None))
    if not kept:
        return None
    return kept[0] if len(kept) == 1 else "(" + "|".join(f"({o})" for o in kept) + ")"


def compact_json(value: Any) -> str:
    """A value as JSON text without whitespace, as the regexes write literal values."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
