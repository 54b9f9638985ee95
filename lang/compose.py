"""Grammars composed in Python, for one gen: `gen("x", grammar="Name: " + capture(...))`.

The pieces (literal text, `regex`, `one_of`, `one_or_more`, `zero_or_more`, `optional`,
`capture`, `json`, `substring`, joined with `+`) nest without recursion, so the whole is a
regular language and compiles to ONE regex, the gen's constraint (`Grammar.regex`). After
the gen, its text is matched with Python's `re.fullmatch` against the same regex with a
named group at each capture, and each capture lands in the state as its own variable
(`Grammar.captures`). The two regexes are written from the same tree, so they accept the
same texts; the constraint's has no named groups.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from braid.grammars.compiling.constraint_regex import constraint_regex, escape, short
from braid.grammars.constraints import COMPACT, JSON_WHITESPACE, JsonSchema
from braid.grammars.regex.substrings import MAX_SUBSTRING_CHUNKS, substrings_regex
from braid.interpreter.captured import Captured
from braid.json_types import schema_and_decoder

_WORD_CHUNKS = re.compile(r"\w+|\s+|[^\w\s]+")


class Grammar:
    """A piece of a gen's grammar; pieces join with `+` (text joins as a literal)."""

    captured: frozenset[str] = frozenset()  # the capture names inside
    matches_empty: bool = False  # whether it accepts the empty text

    def __add__(self, other: Grammar | str) -> Grammar:
        if not isinstance(other, Grammar | str):
            return NotImplemented  # a gen or role part: its own error says what joins
        return _Sequence((self, _piece(other)))

    def __radd__(self, other: str) -> Grammar:
        if not isinstance(other, str):
            return NotImplemented
        return _Sequence((_piece(other), self))

    @cached_property
    def regex(self) -> str:
        """The regex of every text this grammar accepts: the gen's constraint."""
        return self._regex(None)

    @cached_property
    def _named(self) -> _Named:
        """The Python patterns that read the captures (compiled on first use)."""
        return _Named(self)

    def captures(self, text: str) -> dict[str, Any]:
        """Each capture's value in `text`: its text (decoded for a capture of `json(Type)`),
        None where it took no part (an alternative not taken, an optional left out), or the
        list of its matches in order inside a repetition. ValueError if the grammar does not
        accept `text` (a gen cut short by max_tokens)."""
        return self._named.read(text)

    def _regex(self, named: _Named | None) -> str:
        """The regex, safe to concatenate; with `named`, with its named groups."""
        raise NotImplementedError

    def _values(self, match: re.Match, named: _Named) -> dict[str, Any]:
        """The captures inside, read from `match` (made by one of `named`'s patterns)."""
        return {}

    def __repr__(self) -> str:
        return f"grammar({short(self.regex)})"


@dataclass(frozen=True, eq=False, repr=False)
class _Literal(Grammar):
    text: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "matches_empty", self.text == "")

    def _regex(self, named: _Named | None) -> str:
        return escape(self.text)


@dataclass(frozen=True, eq=False, repr=False)
class _Regex(Grammar):
    pattern: str
    empty: bool  # whether the pattern accepts the empty text

    def __post_init__(self) -> None:
        object.__setattr__(self, "matches_empty", self.empty)

    def _regex(self, named: _Named | None) -> str:
        return f"(?:{self.pattern})"


@dataclass(frozen=True, eq=False, repr=False)
class _Composite(Grammar):
    """Pieces whose captures are their parts' (a sequence, alternatives)."""

    parts: tuple[Grammar, ...]

    def __post_init__(self) -> None:
        names: set[str] = set()
        for part in self.parts:
            if twice := names & part.captured:
                raise ValueError(
                    f"capture {sorted(twice)[0]!r} appears twice in one grammar; capture "
                    "the alternatives together (capture(one_of(...), name)) instead"
                )
            names |= part.captured
        object.__setattr__(self, "captured", frozenset(names))

    def _values(self, match: re.Match, named: _Named) -> dict[str, Any]:
        return {k: v for part in self.parts for k, v in part._values(match, named).items()}


@dataclass(frozen=True, eq=False, repr=False)
class _Sequence(_Composite):
    def __post_init__(self) -> None:
        # A sequence of sequences is flat: long `a + b + c + ...` chains nest no deeper.
        flat = tuple(p for part in self.parts for p in _parts_if_sequence(part))
        object.__setattr__(self, "parts", flat)
        super().__post_init__()
        object.__setattr__(self, "matches_empty", all(p.matches_empty for p in flat))

    def _regex(self, named: _Named | None) -> str:
        return "".join(part._regex(named) for part in self.parts)


@dataclass(frozen=True, eq=False, repr=False)
class _OneOf(_Composite):
    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "matches_empty", any(p.matches_empty for p in self.parts))

    def _regex(self, named: _Named | None) -> str:
        return "(?:" + "|".join(part._regex(named) for part in self.parts) + ")"


@dataclass(frozen=True, eq=False, repr=False)
class _Repeat(Grammar):
    """`item` repeated: at least `least` times (0 or 1), at most once if `once`."""

    item: Grammar
    least: int
    once: bool = False

    def __post_init__(self) -> None:
        if not self.once and self.item.matches_empty:
            raise ValueError(
                f"{self._name()}: {self.item!r} accepts the empty text, so its repetitions "
                "cannot be told apart; make it accept at least one character"
            )
        object.__setattr__(self, "captured", self.item.captured)
        object.__setattr__(self, "matches_empty", self.least == 0 or self.item.matches_empty)

    def _name(self) -> str:
        return "optional" if self.once else ("zero_or_more", "one_or_more")[self.least]

    def _regex(self, named: _Named | None) -> str:
        quantifier = "?" if self.once else "*+"[self.least]
        body = f"(?:{self.item._regex(named)}){quantifier}"
        if named is not None and self.captured and not self.once:
            return f"(?P<{named.group(self)}>{body})"  # its span, for _values to walk
        return body

    def _values(self, match: re.Match, named: _Named) -> dict[str, Any]:
        if self.once or not self.captured:  # at most once: read as if it were not there
            return self.item._values(match, named)
        # Python keeps a group's last repetition only: the repetition's text is walked again,
        # item by item, each item followed by a text the rest of the repetition accepts.
        values: dict[str, list] = {name: [] for name in self.captured}
        start, end = match.span(named.group(self))
        while start < end:
            item = named.item_pattern(self).match(match.string, start, end)
            for name, value in self.item._values(item, named).items():
                if value is not None:
                    values[name].append(value)
            start = item.end()
        return values


@dataclass(frozen=True, eq=False, repr=False)
class _Capture(Grammar):
    item: Grammar
    name: str

    def __post_init__(self) -> None:
        if self.name in self.item.captured:
            raise ValueError(f"capture {self.name!r} appears twice in one grammar")
        object.__setattr__(self, "captured", self.item.captured | {self.name})
        object.__setattr__(self, "matches_empty", self.item.matches_empty)

    def _regex(self, named: _Named | None) -> str:
        inner = self.item._regex(named)
        return f"(?P<{named.group(self)}>{inner})" if named is not None else inner

    def _values(self, match: re.Match, named: _Named) -> dict[str, Any]:
        text = match.group(named.group(self))
        decode = self.item.decode if isinstance(self.item, _Json) else None
        value = decode(text) if decode is not None and text is not None else text
        return {**self.item._values(match, named), self.name: value}


@dataclass(frozen=True, eq=False, repr=False)
class _Json(Grammar):
    """A JSON document under a schema (with the whitespace gen(json_schema=...) allows)."""

    pattern: str
    decode: Callable[[str], Any] | None  # into the type it was given as, if one

    def _regex(self, named: _Named | None) -> str:
        return f"(?:{self.pattern})"


class _Named:
    """A grammar's Python patterns for reading captures: its regex with a named group at
    each capture and at each repetition holding one, and a pattern per such repetition for
    walking its items. Groups are numbered in the order the regex is written, so a grammar
    built again writes the same pattern, which re's own cache then has compiled."""

    def __init__(self, root: Grammar) -> None:
        self._root = root
        self._groups: dict[int, str] = {}  # id(piece) -> its group's name
        self._items: dict[int, re.Pattern] = {}
        self.pattern = re.compile(root._regex(self))

    def read(self, text: str) -> dict[str, Any]:
        """The captures in `text` (see Grammar.captures)."""
        match = self.pattern.fullmatch(text)
        if match is None:
            raise ValueError(f"{text!r} does not match the grammar")
        return self._root._values(match, self)

    def group(self, piece: Grammar) -> str:
        return self._groups.setdefault(id(piece), f"_g{len(self._groups)}")

    def item_pattern(self, repeat: _Repeat) -> re.Pattern:
        """One item of `repeat`, followed by what the rest of the repetition accepts."""
        if id(repeat) not in self._items:
            rest = repeat.item._regex(None)
            item = repeat.item._regex(self)  # the same group names as in `pattern`
            self._items[id(repeat)] = re.compile(f"{item}(?=(?:{rest})*\\Z)")
        return self._items[id(repeat)]


def regex(pattern: str) -> Grammar:
    """Text matching the regex `pattern` (Python syntax; the engine's regexes read it, but
    for lookarounds, backreferences and anchors inside). Its own groups capture nothing:
    use `capture`."""
    if not isinstance(pattern, str):
        raise TypeError(f"regex() takes a pattern string, got {pattern!r}")
    try:  # alone, then as a piece (inline flags are valid only at a regex's start)
        compiled = re.compile(pattern)
        re.compile(f"(?:{pattern})")
    except re.error as e:
        raise ValueError(f"regex({pattern!r}) is not a valid regex: {e}") from None
    if compiled.groupindex:
        raise ValueError(
            f"regex({pattern!r}): named groups are not captures here; wrap the piece in "
            "capture(regex(...), name) instead"
        )
    return _Regex(pattern, compiled.fullmatch("") is not None)


def one_of(*options: Grammar | str) -> Grammar:
    """Exactly one of `options` (grammars or text), as `one_of("yes", "no")` or
    `one_of(["yes", "no"])`. It is sampled under the gen's constraint, where `select`
    scores fixed choices without sampling."""
    if len(options) == 1 and isinstance(options[0], list | tuple):
        options = tuple(options[0])
    if not options:
        raise ValueError("one_of() needs at least one option")
    return _OneOf(tuple(_piece(o) for o in options))


def one_or_more(item: Grammar | str) -> Grammar:
    """`item` one or more times; a capture inside holds the list of its matches."""
    return _Repeat(_piece(item), least=1)


def zero_or_more(item: Grammar | str) -> Grammar:
    """`item` any number of times (none too); a capture inside holds the list of its
    matches."""
    return _Repeat(_piece(item), least=0)


def optional(item: Grammar | str) -> Grammar:
    """`item` or nothing; a capture inside is None where it was left out."""
    return _Repeat(_piece(item), least=0, once=True)


def capture(item: Grammar | str, name: str) -> Grammar:
    """`item`, whose text becomes the state variable `name` after the gen (decoded for a
    `json(Type)`), as if it were its own gen."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"capture(): the name must be a non-empty string, got {name!r}")
    return _Capture(_piece(item), name)


def json(schema: Any, compact: bool = False) -> Grammar:
    """A JSON document valid under `schema`: a dict, JSON text, or a type as
    gen(json_schema=...) takes it (msgspec.Struct, dataclass, TypedDict, pydantic BaseModel,
    list[Model], ...), with the whitespace models write (bounded) or, `compact`, none, as
    gen(json_compact=True). Captured, a type's document comes back decoded into it."""
    where = f"json({getattr(schema, '__name__', 'schema')})"
    described, decode = schema_and_decoder(schema, where)
    try:
        whitespace = COMPACT if compact else JSON_WHITESPACE
        pattern = constraint_regex(JsonSchema.of(described, whitespace))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return _Json(pattern, decode)


def substring(text: str, chunk: str = "word") -> Grammar:
    """Any non-empty run of `text`'s chunks, in order: with chunk="word", of its words,
    whitespace runs and punctuation runs ("quick brown", " fox.", not "uick"); with
    chunk="character", any substring. ValueError past MAX_SUBSTRING_CHUNKS chunks."""
    if not isinstance(text, str) or not text:
        raise ValueError("substring() needs a non-empty text")
    if chunk == "word":
        chunks = _WORD_CHUNKS.findall(text)
    elif chunk == "character":
        chunks = list(text)
    else:
        raise ValueError(f"substring(): chunk must be 'word' or 'character', got {chunk!r}")
    if len(chunks) > MAX_SUBSTRING_CHUNKS:
        raise ValueError(
            f"substring(): the text has {len(chunks)} {chunk} chunks, more than "
            f"MAX_SUBSTRING_CHUNKS ({MAX_SUBSTRING_CHUNKS}); give a shorter text"
        )
    return _Regex(substrings_regex(chunks), empty=False)


def _piece(value: Grammar | str) -> Grammar:
    if isinstance(value, Grammar):
        return value
    if isinstance(value, str):
        return _Literal(value)
    raise TypeError(
        f"a grammar piece is text or a grammar (regex, one_of, capture, json, ...), got {value!r}"
    )


def _parts_if_sequence(piece: Grammar) -> Iterable[Grammar]:
    return piece.parts if isinstance(piece, _Sequence) else (piece,)


def gen_grammar(name: str | None, grammar: Grammar) -> tuple[str, Callable[[str], Any] | None]:
    """A gen's regex for `grammar`, and its decoder: the text stays the gen's value, the
    captures go with it (None without captures: nothing to decode)."""
    if name is not None and name in grammar.captured:
        raise ValueError(f"gen({name!r}): a capture of the grammar has the gen's own name")
    if not grammar.captured:
        return grammar.regex, None
    named = grammar._named  # compiled now, on the program's thread, not on the event loop
    return grammar.regex, lambda text: Captured(text, named.read(text))
