"""What a stop regex may be: checked where SamplingParams is made, without building its
automaton (the grammar compiler builds that later, off the request path)."""

from __future__ import annotations

import re

from braid.grammars.regex.char_regex import check_pattern


def check_stop_regex(pattern: str) -> None:
    """Raise ValueError naming what is wrong with a stop regex; cheap."""
    try:
        check_pattern(pattern)
    except ValueError as e:
        raise ValueError(f"SamplingParams: stop_regex {pattern!r} is {e}") from None
    if re.fullmatch(pattern, ""):
        raise ValueError(f"SamplingParams: stop_regex {pattern!r} matches the empty string")
