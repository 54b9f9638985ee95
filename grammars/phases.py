"""A reasoning request's grammar in phases: the model thinks, the thought closes, then the
answer is held to the request's own grammar.

In token ids, as the model's reasoning format writes its markers (runtime/text/reasoning.py):
a turn that may open a thought ("maybe": the start marker, or an answer at once); the thought
(every token but the excluded ones: EOS and stop tokens, which would end the output before
its answer); the end marker (multi-token markers are followed token by token); what a
format puts before an answer (harmony's final header, forced); then the answer, with leading
a few whitespace tokens allowed before the inner grammar's first token.

A budget bounds the thought: at `budget` thought tokens the end marker is forced. A soft
budget also offers the end marker from `soft_from` on: the sampler forces it at the first
step where it is among the model's top candidates (`close_candidate`). Every accepted token
is kept with the phase before it, so rollback (speculative decoding, jump-forward's merges)
crosses phase switches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from braid.grammars.matcher import (
    Matcher,
    accept_all,
    allocate_bitmask,
    clear_bits,
    only_bits,
    set_bits,
)

# The phases, in order.
MAYBE, THOUGHT, HEADER, LEAD, ANSWER = "maybe", "thought", "header", "lead", "answer"
# Whitespace tokens allowed before an answer (templates write a newline or two after the end
# tag); bounded, since a model held off its own next token may take whitespace forever. None
# after a forced header: the answer follows it at once.
LEAD_SPACES = 4


@dataclass(frozen=True)
class Phases:
    """One request's phase plan. `opening` is where its prompt leaves the model ("maybe",
    "thinking" or "off"); `direct_ids` open an answer given without a thought (harmony),
    `answer_ids` stand between the end marker and the answer; `closer_ids` end a thought
    and begin the answer when the inner grammar takes them (Qwen3's `<tool_call>`)."""

    opening: str
    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    answer_ids: tuple[int, ...] = ()
    direct_ids: tuple[int, ...] = ()
    closer_ids: frozenset[int] = frozenset()
    excluded: frozenset[int] = frozenset()
    budget: int | None = None
    soft_from: int | None = None  # None: a hard budget (or none)
    guard: MarkerGuard | None = None  # keeps the end marker's text to its own tokens


@dataclass(frozen=True)
class MarkerGuard:
    """Keeps a thought from spelling its end marker in other tokens than the marker's own
    (`</` `think` `>` where `</think>` is one token): the text splitter ends a thought at the
    marker's text, so that text may appear only where the phases switch. `rows[0]` forbids
    the tokens that hold the whole marker, `rows[k]` those that finish it after its first k
    bytes (forbidden where the thought's text ends with them)."""

    marker: bytes
    rows: tuple[torch.Tensor, ...]

    @classmethod
    def of(cls, marker: bytes, token_bytes: tuple[bytes | None, ...]) -> MarkerGuard:
        held = [i for i, b in enumerate(token_bytes) if b and marker in b]
        finishing = [
            [i for i, b in enumerate(token_bytes) if b and b.startswith(marker[k:])]
            for k in range(1, len(marker))
        ]
        size = len(token_bytes)
        return cls(marker, tuple(_bits(ids, size) for ids in [held, *finishing]))

    def forbid(self, row: torch.Tensor, tail: bytes) -> None:
        """Take out of `row` the tokens that would finish the marker after `tail`."""
        row &= ~self.rows[0]
        for k in range(1, len(self.marker)):
            if tail.endswith(self.marker[:k]):
                row &= ~self.rows[k]

    def spells(self, tail: bytes, token: bytes | None) -> bool:
        return token is not None and self.marker in tail + token

    def tail(self, tail: bytes, token: bytes | None) -> bytes:
        """The thought's last bytes (fewer than the marker's) after `token`; a special token
        (no bytes) breaks the text."""
        keep = len(self.marker) - 1
        return (tail + token)[len(tail + token) - keep :] if token is not None and keep else b""


@dataclass(frozen=True)
class TokenClasses:
    """What the phases need of a vocabulary, computed once per engine: its size, the bitmask
    row of its real tokens, and that of its whitespace-only tokens."""

    size: int
    every: torch.Tensor
    whitespace: torch.Tensor
    whitespace_ids: frozenset[int]
    token_bytes: tuple[bytes | None, ...]

    @classmethod
    def of(cls, token_bytes: tuple[bytes | None, ...]) -> TokenClasses:
        size = len(token_bytes)
        every = allocate_bitmask(1, size)[0]
        spare = every.numel() * 32 - size  # bits past the last token
        if spare:
            every[-1] = (1 << (32 - spare)) - 1
        ws = {i for i, b in enumerate(token_bytes) if b and not b.strip(b" \t\r\n")}
        return cls(size, every, _bits(ws, size), frozenset(ws), token_bytes)


@dataclass
class _At:
    """Where the phases stand: a phase, the marker tokens matched in it, thought tokens."""

    phase: str
    matched: tuple[int, ...] = ()
    thought: int = 0
    reasoning: int = 0  # tokens before the answer, markers included
    inner: int = 0  # tokens the move here fed the inner grammar
    tail: bytes = b""  # the thought's last bytes (MarkerGuard)
    spaces: int = 0  # whitespace tokens still allowed before the answer's first token


class PhasedMatcher(Matcher):
    def __init__(self, inner: Matcher, phases: Phases, classes: TokenClasses) -> None:
        self.inner = inner
        self.phases = phases
        self.classes = classes
        first = {"maybe": MAYBE, "thinking": THOUGHT, "off": LEAD}[phases.opening]
        if first == MAYBE and phases.budget == 0 and not phases.direct_ids:
            first = LEAD  # no thought: the answer starts at once
        self._at = _At(first, spaces=LEAD_SPACES)
        self._history: list[_At] = []

    @property
    def reasoning_tokens(self) -> int:
        """Tokens written before the answer: the thought with its markers."""
        return self._at.reasoning

    @property
    def in_answer(self) -> bool:
        return self._at.phase in (LEAD, ANSWER)

    def close_candidate(self) -> int | None:
        """The end marker's next token where a soft budget offers it now, else None."""
        at, p = self._at, self.phases
        if at.phase != THOUGHT or p.soft_from is None or at.thought < p.soft_from:
            return None
        return p.end_ids[len(at.matched)]

    # ---- Matcher ------------------------------------------------------------------------

    def fill_bitmask(self, row: torch.Tensor) -> None:
        at, p = self._at, self.phases
        if at.phase == ANSWER:
            self.inner.fill_bitmask(row)
            return
        if at.phase == LEAD:
            self.inner.fill_bitmask(row)
            if at.spaces:
                row |= self.classes.whitespace
            return
        if at.phase == HEADER:
            only_bits(row, [p.answer_ids[len(at.matched)]])
            return
        if at.phase == THOUGHT:
            if self._forced_end():
                only_bits(row, [p.end_ids[len(at.matched)]])
                return
            row.copy_(self.classes.every)
            clear_bits(row, p.excluded)
            if p.guard is not None:
                p.guard.forbid(row, at.tail)
                set_bits(row, [p.end_ids[len(at.matched)]])  # the marker's own next token
            return
        # MAYBE: the start marker, a direct answer's header, whitespace, or the answer at once
        # (which may begin with the start marker's first tokens: harmony's `<|channel|>`).
        nexts = [s[len(at.matched)] for s in self._openers() if s[: len(at.matched)] == at.matched]
        row.zero_()
        if not p.direct_ids and accept_all(self.inner, at.matched):
            self.inner.fill_bitmask(row)
            if at.matched:
                self.inner.rollback(len(at.matched))
        row |= _bits(nexts, self.classes.size)
        if not at.matched and at.spaces:
            row |= self.classes.whitespace

    def fill_bitmask_within(self, row: torch.Tensor, tokens_left: int) -> bool:
        """Steered in the answer (the inner grammar's), before it (whitespace only while the
        answer still fits after it) and in the thought (its end is forced once what follows
        it, end marker, header and the answer's shortest completion, would no longer fit
        after one more thought token). The opening phase is not steered."""
        at, p = self._at, self.phases
        if at.phase == ANSWER:
            return self.inner.fill_bitmask_within(row, tokens_left)
        answer = self.inner.shortest_completion()
        if at.phase == LEAD:
            steered = self.inner.fill_bitmask_within(row, tokens_left)
            if at.spaces:
                if answer is None or answer <= tokens_left - 1:
                    row |= self.classes.whitespace
                else:
                    steered = True
            return steered
        if at.phase == THOUGHT and answer is not None and not self._forced_end():
            after = len(p.end_ids) - len(at.matched) + len(p.answer_ids) + answer
            if tokens_left - 1 < after <= tokens_left:
                only_bits(row, [p.end_ids[len(at.matched)]])
                return True
        self.fill_bitmask(row)
        return False

    def shortest_completion(self) -> int | None:
        if self._at.phase == ANSWER:
            return self.inner.shortest_completion()
        return None

    def accept_token(self, token_id: int) -> bool:
        before = self._at
        after = self._next(before, token_id)
        if after is None:
            return False
        self._history.append(before)
        self._at = after
        return True

    def is_terminated(self) -> bool:
        return self._at.phase == ANSWER and self.inner.is_terminated()

    def rollback(self, n: int) -> None:
        if n > len(self._history):
            raise ValueError(f"cannot roll back {n} tokens: {len(self._history)} were accepted")
        if n <= 0:
            return
        undone = self._history[-n:]
        inner = sum(a.inner for a in [*undone[1:], self._at])
        if inner:
            self.inner.rollback(inner)
        self._at = undone[0]
        del self._history[-n:]

    def jump_forward(self) -> str:
        return self.inner.jump_forward() if self._at.phase == ANSWER else ""

    # ---- the phases -----------------------------------------------------------------------

    def _openers(self) -> list[tuple[int, ...]]:
        p = self.phases
        starts = [p.start_ids] if p.budget != 0 else []
        return starts + ([p.direct_ids] if p.direct_ids else [])

    def _forced_end(self) -> bool:
        at, budget = self._at, self.phases.budget
        return budget is not None and (at.thought >= budget or bool(at.matched))

    def _next(self, at: _At, t: int) -> _At | None:
        """The state after `at` takes token t, or None where t is not allowed."""
        p = self.phases
        reasoning = at.reasoning + 1
        if at.phase == ANSWER:
            return (
                _At(ANSWER, reasoning=at.reasoning, inner=1) if self.inner.accept_token(t) else None
            )
        if at.phase == LEAD:
            if self.inner.accept_token(t):
                return _At(ANSWER, reasoning=at.reasoning, inner=1)
            if at.spaces and t in self.classes.whitespace_ids:
                return _At(LEAD, reasoning=at.reasoning, spaces=at.spaces - 1)
            return None
        if at.phase == HEADER:
            if t != p.answer_ids[len(at.matched)]:
                return None
            matched = (*at.matched, t)
            if matched == p.answer_ids:
                return _At(LEAD, reasoning=reasoning)
            return _At(HEADER, matched, reasoning=reasoning)
        if at.phase == THOUGHT:
            return self._thinking(at, t)
        # MAYBE
        matched = (*at.matched, t)
        for opener in self._openers():
            if opener[: len(matched)] == matched:
                if matched == opener:
                    if opener == p.start_ids and p.budget != 0:
                        return _At(THOUGHT, reasoning=reasoning)
                    return _At(LEAD, reasoning=reasoning)  # after a direct header
                return _At(MAYBE, matched, reasoning=reasoning, spaces=at.spaces)
        if not p.direct_ids and accept_all(self.inner, matched):
            return _At(ANSWER, reasoning=at.reasoning - len(at.matched), inner=len(matched))
        if at.matched:
            return None
        if at.spaces and t in self.classes.whitespace_ids:
            return _At(MAYBE, reasoning=reasoning, spaces=at.spaces - 1)
        return None

    def _thinking(self, at: _At, t: int) -> _At | None:
        p = self.phases
        reasoning = at.reasoning + 1
        if self._forced_end() and t != p.end_ids[len(at.matched)]:
            return None
        if t in p.excluded:
            return None
        text = self.classes.token_bytes[t] if t < self.classes.size else None
        tail = p.guard.tail(at.tail, text) if p.guard is not None else b""
        if t == p.end_ids[len(at.matched)]:
            matched = (*at.matched, t)
            if matched == p.end_ids:
                if p.answer_ids:
                    return _At(HEADER, reasoning=reasoning)
                return _At(LEAD, reasoning=reasoning, spaces=LEAD_SPACES)
            return _At(THOUGHT, matched, at.thought, reasoning, tail=tail)
        if p.guard is not None and p.guard.spells(at.tail, text):
            return None
        if t in p.closer_ids and self.inner.accept_token(t):
            return _At(ANSWER, reasoning=at.reasoning, inner=1)
        # A partial end marker not continued was thought after all.
        thought = at.thought + len(at.matched) + 1
        if at.matched and t == p.end_ids[0]:
            return _At(THOUGHT, (t,), thought - 1, reasoning, tail=tail)
        return _At(THOUGHT, (), thought, reasoning, tail=tail)


class FreeMatcher(Matcher):
    """An answer held to nothing: every real token allowed, EOS ending it."""

    def __init__(self, classes: TokenClasses, eos_token_ids: frozenset[int]) -> None:
        self.classes = classes
        self.eos = eos_token_ids
        self._taken: list[int] = []

    def fill_bitmask(self, row: torch.Tensor) -> None:
        if self.is_terminated():
            only_bits(row, sorted(self.eos))
        else:
            row.copy_(self.classes.every)

    def accept_token(self, token_id: int) -> bool:
        if self.is_terminated() or not 0 <= token_id < self.classes.size:
            return False
        self._taken.append(token_id)
        return True

    def is_terminated(self) -> bool:
        return bool(self._taken) and self._taken[-1] in self.eos

    def rollback(self, n: int) -> None:
        if n > len(self._taken):
            raise ValueError(f"cannot roll back {n} tokens: {len(self._taken)} were accepted")
        if n > 0:
            del self._taken[-n:]

    def jump_forward(self) -> str:
        return ""


def _bits(ids, size: int) -> torch.Tensor:
    """A bitmask row of `size` tokens allowing `ids`."""
    row = torch.zeros((size + 31) // 32, dtype=torch.int32)
    set_bits(row, [t for t in ids if 0 <= t < size])
    return row
