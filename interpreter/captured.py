"""A gen's decoded value with the variables its text sets besides its own: the captures of
a composed grammar (braid.compose), stored as if each were its own gen."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Captured:
    value: Any  # the gen's own variable
    variables: dict[str, Any]  # name -> value, each another variable of the state
