"""The interface every compiled constraint offers the runtime, and the bitmask layout.

A `Grammar` is the compiled, immutable, shareable form of a constraint for one vocabulary;
a `Matcher` is one request's position in it. Bitmask layout (shared with kernels.sample):
int32 `[rows, ceil(V / 32)]`, bit `t % 32` of word `t // 32` set allows token `t`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """All-allowed int32 bitmask rows (-1 is every bit set)."""
    return torch.full((rows, bitmask_words(vocab_size)), -1, dtype=torch.int32)


def allowed_token_ids(row: torch.Tensor) -> list[int]:
    """The token ids a bitmask row allows (for tests and debugging)."""
    bits = (row.to(torch.int64).unsqueeze(-1) >> torch.arange(32)) & 1
    return bits.flatten().nonzero().flatten().tolist()


def set_bits(row: torch.Tensor, token_ids) -> None:
    """Allow `token_ids` in a bitmask row, leaving its other bits as they are."""
    for t in token_ids:
        word, bit = divmod(t, 32)
        if word < row.numel():
            # int32 words: bit 31 is the sign bit, so build the value in Python and wrap it.
            value = (int(row[word]) & 0xFFFFFFFF) | (1 << bit)
            row[word] = value - (1 << 32) if value >= 1 << 31 else value


def clear_bits(row: torch.Tensor, token_ids) -> None:
    """Forbid `token_ids` in a bitmask row, leaving its other bits as they are."""
    for t in token_ids:
        word, bit = divmod(t, 32)
        if word < row.numel():
            value = int(row[word]) & 0xFFFFFFFF & ~(1 << bit)
            row[word] = value - (1 << 32) if value >= 1 << 31 else value


def only_bits(row: torch.Tensor, token_ids) -> None:
    """Allow exactly `token_ids` in a bitmask row."""
    row.zero_()
    set_bits(row, token_ids)


def has_bit(row: torch.Tensor, token_id: int) -> bool:
    """Whether a bitmask row allows `token_id`."""
    word, bit = divmod(token_id, 32)
    return word < row.numel() and (int(row[word]) >> bit) & 1 == 1


class MatcherError(RuntimeError):
    """A matcher cannot go on (its automaton ran out of budget): the runtime fails that
    request with this message and keeps serving the others."""


class Matcher(ABC):
    """One request's progress through a grammar.

    The runtime calls `fill_bitmask` before sampling, then `accept_token` with the sampled
    id. Speculative decoding accepts draft tokens and `rollback`s the rejected ones.
    """

    @abstractmethod
    def fill_bitmask(self, row: torch.Tensor) -> None:
        """Overwrite `row` (int32 [ceil(V/32)]) with the tokens allowed next. EOS ids are
        allowed only where the text so far is a complete sentence of the grammar; once the
        grammar is terminated only EOS is allowed."""

    def fill_bitmask_within(self, row: torch.Tensor, tokens_left: int) -> bool:
        """`fill_bitmask`, steered so that the text can be completed within `tokens_left`
        tokens (the one sampled next included): a token is allowed only where what follows
        it can be completed in the tokens left after it. True when that removed a token
        the plain mask allows (the output was steered). Where the text cannot be completed
        in time, the plain mask. This default does not steer."""
        self.fill_bitmask(row)
        return False

    def shortest_completion(self) -> int | None:
        """An upper bound on the tokens that complete the text from here (0: it is complete
        now); None where the matcher cannot tell."""
        return None

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (and no change) if the grammar forbids it."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once EOS was accepted, or the text is complete and nothing can follow it."""

    @abstractmethod
    def rollback(self, n: int) -> None:
        """Undo the last `n` accepted tokens."""

    @abstractmethod
    def jump_forward(self) -> str:
        """The text the grammar forces next whatever the model does (possibly empty).

        It does not advance the matcher: the runtime tokenizes the text and accepts those
        tokens, so model and matcher stay in step."""


class Grammar(ABC):
    """A constraint compiled for one vocabulary; immutable and shared across requests."""

    @abstractmethod
    def matcher(self) -> Matcher: ...

    @abstractmethod
    def memory_bytes(self) -> int:
        """An estimate of the memory the grammar holds now (its automaton or tables and
        what it has cached so far, not the vocabulary structures grammars share), for the
        compile cache's budget. It may grow as requests reach new states; cheap to call."""


def accept_all(matcher: Matcher, tokens) -> bool:
    """Advance `matcher` by every token or, where one is refused, by none."""
    for n, t in enumerate(tokens):
        if not matcher.accept_token(t):
            if n:
                matcher.rollback(n)
            return False
    return True
