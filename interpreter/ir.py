"""The operations a program appends to its state, in the order it appends them.

`lang` builds these (`gen(...)`, `select(...)`, `user(...)`); the executor runs them. They
are not text: using one as a string outside a program state raises an error that says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from braid.runtime.sampling_params import SamplingParams


class _NotText:
    """Mixin for operations: refuse to be turned into or joined with text."""

    def _misuse(self, *_: object) -> str:
        raise TypeError(
            f"{self!r} is not text: append it to a program's state inside a @program "
            "function (s += ...)"
        )

    __str__ = __format__ = __add__ = __radd__ = _misuse


@dataclass(eq=False, repr=False)
class Gen(_NotText):
    """Generate text into variable `name`.

    `sampling` holds only the SamplingParams fields the caller gave (already validated), so
    a program's defaults fill the rest when it runs. `decode` turns the text into the
    variable's value (an int for dtype=int, a msgspec type for json_schema=Type).
    """

    name: str | None
    sampling: dict[str, Any]
    decode: Callable[[str], Any] | None = None

    def params(self, defaults: dict[str, Any]) -> SamplingParams:
        return SamplingParams(**{**defaults, **self.sampling})

    def __repr__(self) -> str:
        return f"gen({self.name!r})"


@dataclass(eq=False, repr=False)
class Select(_NotText):
    """Append whichever of `choices` the model scores best, and store it in `name`."""

    name: str | None
    choices: tuple[str, ...]
    method: str

    def __repr__(self) -> str:
        return f"select({self.name!r})"


@dataclass(eq=False, repr=False)
class RoleBegin(_NotText):
    role: str

    def __repr__(self) -> str:
        return f"{self.role}_begin()"


@dataclass(eq=False, repr=False)
class RoleEnd(_NotText):
    role: str

    def __repr__(self) -> str:
        return f"{self.role}_end()"


@dataclass(eq=False, repr=False)
class Role(_NotText):
    """A whole message: its parts (text and operations) framed by the chat template."""

    role: str
    parts: tuple[Any, ...]

    def __repr__(self) -> str:
        return f"{self.role}(...)"


Op = str | Gen | Select | RoleBegin | RoleEnd | Role
