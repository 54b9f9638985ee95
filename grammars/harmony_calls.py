"""Tool calls in harmony's format (GPT-OSS), as one grammar over token ids.

A call is ` to=functions.NAME<|channel|>commentary json<|message|>ARGS<|call|>` (after the
`<|start|>assistant` the phases force): the name as text under a Choices grammar, the
channel header as special tokens, the arguments under the named tool's schema, then
`<|call|>`. Where the reply may be text instead (tool_choice "auto", or a response_format), it
may open `<|channel|>final<|message|>` and write text (free, or under its own grammar) ending
at `<|return|>`. Harmony ends a turn at a call, so a reply is one call.

The parts are compiled as usual (cached, in the workers) and put together per request.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from braid.grammars.matcher import Grammar, Matcher, clear_bits, has_bit, only_bits, set_bits

PREFIX = " to=functions."
CHANNEL = "<|channel|>commentary json<|message|>"
FINAL = "<|channel|>final<|message|>"

# The parts of a reply, in order: a call's, or a text reply's.
START, NAME, HEADER, ARGS, FINAL_HEADER, TEXT, DONE = range(7)


@dataclass(frozen=True)
class HarmonyTokens:
    """The token ids the format's special parts are written with, and the vocabulary's."""

    channel: tuple[int, ...]  # CHANNEL
    final: tuple[int, ...]  # FINAL
    call: int  # <|call|>: ends a call
    ret: int  # <|return|>: ends a text reply
    eos: frozenset[int]  # what the parts' grammars allow where they are complete
    token_bytes: tuple[bytes | None, ...]
    every: torch.Tensor  # the bitmask row of every real token


class HarmonyCallsGrammar(Grammar):
    """`names`: a Choices grammar of PREFIX + each tool's name; `arguments`: each name's
    schema grammar; `text`: a text reply's grammar (None: calls only; "free": any text)."""

    def __init__(
        self,
        names: Grammar,
        arguments: dict[str, Grammar],
        text: Grammar | str | None,
        tokens: HarmonyTokens,
    ) -> None:
        self.names, self.arguments, self.text, self.tokens = names, arguments, text, tokens

    def matcher(self) -> Matcher:
        return HarmonyCallsMatcher(self)

    def memory_bytes(self) -> int:
        parts = [self.names, *self.arguments.values()]
        if isinstance(self.text, Grammar):
            parts.append(self.text)
        return sum(g.memory_bytes() for g in parts)


@dataclass(frozen=True)
class _At:
    part: int
    matched: int = 0  # tokens of a forced header taken
    name: bytes = b""  # the call's name text so far
    inner: Matcher | None = None  # the part's matcher that took the token that moved here


class HarmonyCallsMatcher(Matcher):
    def __init__(self, grammar: HarmonyCallsGrammar) -> None:
        self.g = grammar
        self._names = grammar.names.matcher()
        self._args: Matcher | None = None  # made once the name is known
        self._text = grammar.text.matcher() if isinstance(grammar.text, Grammar) else None
        self._at = _At(START if grammar.text is not None else NAME)
        self._history: list[_At] = []

    def fill_bitmask(self, row: torch.Tensor) -> None:
        at, tok = self._at, self.g.tokens
        if at.part in (START, NAME):
            self._names.fill_bitmask(row)
            extra = [tok.channel[0]] if self._name() in self.g.arguments else []
            clear_bits(row, tok.eos)
            set_bits(row, extra + ([tok.final[0]] if at.part == START else []))
        elif at.part == HEADER:
            only_bits(row, [tok.channel[at.matched]])
        elif at.part == ARGS:
            self._args.fill_bitmask(row)
            _end_with(row, tok, tok.call)
        elif at.part == FINAL_HEADER:
            only_bits(row, [tok.final[at.matched]])
        elif at.part == TEXT and self._text is None:
            row.copy_(tok.every)
            clear_bits(row, tok.eos - {tok.ret})
        elif at.part == TEXT:
            self._text.fill_bitmask(row)
            _end_with(row, tok, tok.ret)
        else:
            only_bits(row, [tok.ret])

    def fill_bitmask_within(self, row: torch.Tensor, tokens_left: int) -> bool:
        """Steered in a call's arguments and in a constrained final text (the token that
        ends the part takes one of the tokens left); the name and headers are not."""
        at, tok = self._at, self.g.tokens
        if at.part == ARGS:
            steered = self._args.fill_bitmask_within(row, tokens_left - 1)
            _end_with(row, tok, tok.call)
            return steered
        if at.part == TEXT and self._text is not None:
            steered = self._text.fill_bitmask_within(row, tokens_left - 1)
            _end_with(row, tok, tok.ret)
            return steered
        self.fill_bitmask(row)
        return False

    def accept_token(self, token_id: int) -> bool:
        after = self._next(token_id)
        if after is None:
            return False
        self._history.append(self._at)
        self._at = after
        return True

    def is_terminated(self) -> bool:
        return self._at.part == DONE

    def rollback(self, n: int) -> None:
        if n > len(self._history):
            raise ValueError(f"cannot roll back {n} tokens: {len(self._history)} were accepted")
        for _ in range(n):
            undone, self._at = self._at, self._history.pop()
            if undone.inner is not None:
                undone.inner.rollback(1)
            if self._at.part in (START, NAME):
                self._args = None

    def jump_forward(self) -> str:
        return ""

    def _name(self) -> str:
        return self._at.name.decode(errors="replace")[len(PREFIX) :]

    def _next(self, t: int) -> _At | None:
        at, tok = self._at, self.g.tokens
        if at.part in (START, NAME):
            if at.part == START and t == tok.final[0]:
                return _At(FINAL_HEADER, 1) if len(tok.final) > 1 else _At(TEXT)
            if t == tok.channel[0] and self._name() in self.g.arguments:
                self._args = self.g.arguments[self._name()].matcher()
                return _At(HEADER, 1, at.name)
            if t in tok.eos or not self._names.accept_token(t):
                return None
            return _At(NAME, 0, at.name + (tok.token_bytes[t] or b""), self._names)
        if at.part == HEADER:
            if t != tok.channel[at.matched]:
                return None
            done = at.matched + 1 == len(tok.channel)
            return _At(ARGS if done else HEADER, at.matched + 1, at.name)
        if at.part == ARGS:
            if t == tok.call:
                return _At(DONE, name=at.name, inner=self._args) if self._ends(self._args) else None
            if t in tok.eos or not self._args.accept_token(t):
                return None
            return _At(ARGS, 0, at.name, self._args)
        if at.part == FINAL_HEADER:
            if t != tok.final[at.matched]:
                return None
            done = at.matched + 1 == len(tok.final)
            return _At(TEXT) if done else _At(FINAL_HEADER, at.matched + 1)
        if at.part == TEXT and self._text is None:
            if t == tok.ret:
                return _At(DONE)
            return _At(TEXT) if t not in tok.eos else None
        if at.part == TEXT:
            if t in tok.eos - {tok.ret}:
                return None
            if t == tok.ret:
                return _At(DONE, inner=self._text) if self._ends(self._text) else None
            return _At(TEXT, inner=self._text) if self._text.accept_token(t) else None
        return None

    def _ends(self, matcher: Matcher) -> bool:
        """Whether `matcher`'s text is complete: it takes one of the vocabulary's EOS ids
        (accepted, so rollback undoes it with the token that ends the part)."""
        return any(matcher.accept_token(e) for e in sorted(self.g.tokens.eos))


def _end_with(row: torch.Tensor, tok: HarmonyTokens, end: int) -> None:
    """A part's mask, its grammar's EOS ids (where it may end) standing for `end`."""
    complete = any(has_bit(row, e) for e in tok.eos)
    clear_bits(row, tok.eos)
    if complete:
        set_bits(row, [end])
