"""The operations a program appends to its state, in the order it appends them.

`lang` builds these (`gen(...)`, `select(...)`, `user(...)`); the executor runs them. They
join with text and each other into Parts (`"A: " + gen("a")`), but they are not text: using
one as a string outside a program state raises an error that says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from braid.runtime.protocol import SamplingParams


class _NotText:
    """Mixin for operations: they join with text and each other (`"A: " + gen("a")` is the
    parts "A: " then gen("a"), as in SGLang), but refuse to be turned into text."""

    def _misuse(self, *_: object) -> str:
        raise TypeError(
            f"{self!r} is not text: append it to a program's state inside a @program "
            "function (s += ...)"
        )

    __str__ = __format__ = _misuse

    def __add__(self, other: object) -> Parts:
        return Parts((*_parts_of(self, other), *_parts_of(other, self)))

    def __radd__(self, other: object) -> Parts:
        return Parts((*_parts_of(other, self), *_parts_of(self, other)))


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
    lora: str | None = None  # a LoRA adapter for this gen alone (None: the program's)

    def params(self, defaults: dict[str, Any]) -> SamplingParams:
        # A program's gens heal the prompt boundary unless told not to (guidance's default);
        # the executor turns it off where the text before the gen is template markup.
        fields = {"token_healing": True, **defaults, **self.sampling}
        if not fields.get("reasoning") and "thinking_budget" not in self.sampling:
            fields.pop("thinking_budget", None)  # the program's budget is its reasoning gens'
        return SamplingParams(**fields)

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
    """Open a `role` message. An assistant message's opening waits for its first text: a
    history turn's where the program writes it, the generation prompt's where the model does
    (runtime/text/generation_openings.py), with `thinking` set as the template's
    enable_thinking (None: the template's default)."""

    role: str
    thinking: bool | None = None

    def __repr__(self) -> str:
        return f"{self.role}_begin()"


@dataclass(eq=False, repr=False)
class RoleEnd(_NotText):
    role: str

    def __repr__(self) -> str:
        return f"{self.role}_end()"


@dataclass(eq=False, repr=False)
class Role(_NotText):
    """A whole message: its parts (text and operations) framed by the chat template;
    `thinking` as RoleBegin's."""

    role: str
    parts: tuple[Any, ...]
    thinking: bool | None = None

    def __repr__(self) -> str:
        return f"{self.role}(...)"


@dataclass(eq=False, repr=False)
class Parts(_NotText):
    """Text and operations joined with `+`, appended in order."""

    items: tuple[Any, ...]

    def __repr__(self) -> str:
        return " + ".join(repr(p) for p in self.items)


@dataclass(eq=False, repr=False)
class VarScopeBegin(_NotText):
    """The text appended from here to the matching VarScopeEnd becomes variable `name`."""

    name: str

    def __repr__(self) -> str:
        return f"var_scope_begin({self.name!r})"


@dataclass(eq=False, repr=False)
class VarScopeEnd(_NotText):
    name: str

    def __repr__(self) -> str:
        return f"var_scope_end({self.name!r})"


@dataclass(eq=False, repr=False)
class SetVar(_NotText):
    """Set variable `name` to `value` at this point of the program."""

    name: str
    value: Any

    def __repr__(self) -> str:
        return f"set_var({self.name!r})"


Op = str | Gen | Select | RoleBegin | RoleEnd | Role | Parts | VarScopeBegin | VarScopeEnd | SetVar


def _parts_of(part: object, partner: object) -> tuple[Any, ...]:
    """What `part` contributes to a join with `partner`: a Parts' items, or itself."""
    if isinstance(part, Parts):
        return part.items
    if isinstance(part, str | _NotText):
        return (part,)
    raise TypeError(
        f"cannot join {type(part).__name__} with {partner!r}: only text, gen(...), "
        "select(...) and role messages join into the parts of a program"
    )
