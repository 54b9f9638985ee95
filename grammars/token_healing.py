"""Token healing: the first generated tokens re-spell the prompt's last token and go on.

A text prompt's last token is often one the model rarely saw before what it would write
next ("is " then "Paris" where it learned "is" then " Paris"). The engine leaves that token
out of the prompt and holds the first output tokens to extend its bytes `p`: a token is
allowed first iff its bytes start with `p`, or are a proper prefix of `p` (the next token
then continues the rest of `p`). Under a constraint the grammar holds the text after `p`.

`HealingIndex` finds the tokens that start with given bytes in one bisection (built once per
vocabulary); `HealingMatcher` wraps a request's matcher (or none, for a free gen) until `p`
is spelled, then hands over to it.
"""

from __future__ import annotations

import bisect

import numpy as np
import torch

from braid.grammars.matcher import Matcher, accept_all, set_bits
from braid.grammars.vocabulary import TokenVocabulary


class HealingIndex:
    """The vocabulary's real tokens sorted by their bytes: those that start with given bytes
    are one contiguous run of the order."""

    def __init__(self, vocab: TokenVocabulary) -> None:
        real = sorted((b, i) for i, b in enumerate(vocab.token_bytes) if b)
        self.vocab = vocab
        self._keys = [b for b, _ in real]
        self._ids = np.array([i for _, i in real], dtype=np.int64)
        self._by_bytes: dict[bytes, int] = {}
        for b, i in real:
            self._by_bytes.setdefault(b, i)
        self._longest = max((len(b) for b in self._keys), default=0)

    def extending(self, prefix: bytes) -> np.ndarray:
        """The ids of the tokens whose bytes start with `prefix` (sorted by their bytes)."""
        lo = bisect.bisect_left(self._keys, prefix)
        hi = len(self._keys) if (end := _successor(prefix)) is None else None
        if hi is None:
            hi = bisect.bisect_left(self._keys, end, lo)
        return self._ids[lo:hi]

    def token_of(self, data: bytes) -> int | None:
        """A token spelling exactly `data`, if any."""
        return self._by_bytes.get(data)

    def spell(self, data: bytes) -> list[int] | None:
        """Tokens spelling `data`, longest first at each point (None where no token spells a
        byte of it). Grammars read bytes, so any spelling of a text takes them to the same
        state: this one feeds an inner grammar the text after `p` of a healing token."""
        out, at = [], 0
        while at < len(data):
            for n in range(min(self._longest, len(data) - at), 0, -1):
                token = self._by_bytes.get(data[at : at + n])
                if token is not None:
                    out.append(token)
                    at += n
                    break
            else:
                return None
        return out

    def heals(self, prompt_ids: list[int]) -> bytes:
        """The bytes to back up over at the end of `prompt_ids` (b"": nothing to heal).

        Not over a special token (its bytes are no text the model would extend), not the
        prompt's only token, not a token that ends inside a character (the output
        text after it would not be text), and not where no other token extends it."""
        if len(prompt_ids) < 2:
            return b""
        last = prompt_ids[-1]
        data = self.vocab.token_bytes[last] if 0 <= last < self.vocab.size else None
        if not data:  # a special token
            return b""
        try:
            data.decode()
        except UnicodeDecodeError:
            return b""
        others = len(self.extending(data)) > 1
        if not others and not any(data[:n] in self._by_bytes for n in range(1, len(data))):
            return b""
        return data


def _successor(prefix: bytes) -> bytes | None:
    """The least byte string above every string that starts with `prefix` (None: none is)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


class HealingMatcher(Matcher):
    """`inner` (None: no constraint) behind the healing of `removed`, the prompt bytes the
    first output tokens must spell again.

    Each accepted token records (the bytes still to spell before it, the tokens it fed the
    inner matcher) so rollback restores both. A healing token p + r feeds `inner` a spelling
    of r, which the inner grammar, reading bytes, takes where it takes r."""

    def __init__(self, inner: Matcher | None, removed: bytes, index: HealingIndex) -> None:
        if not removed:
            raise ValueError("HealingMatcher: nothing to heal (removed bytes are empty)")
        self.inner = inner
        self.index = index
        self.rest = removed  # the bytes of the removed token still to spell
        self._history: list[tuple[bytes, int]] = []

    @property
    def healing(self) -> bool:
        return bool(self.rest)

    def fill_bitmask(self, row: torch.Tensor) -> None:
        if not self.rest:
            if self.inner is None:
                row.fill_(-1)  # as an unconstrained row
            else:
                self.inner.fill_bitmask(row)
            return
        allowed = np.zeros(row.numel() * 32, dtype=bool)
        allowed[self._extensions()] = True
        packed = np.packbits(allowed, bitorder="little").view(np.int32)
        row.copy_(torch.from_numpy(packed))
        set_bits(row, self._prefixes())

    def fill_bitmask_within(self, row: torch.Tensor, tokens_left: int) -> bool:
        if self.rest or self.inner is None:  # a healing token leaves every text reachable
            self.fill_bitmask(row)
            return False
        return self.inner.fill_bitmask_within(row, tokens_left)

    def shortest_completion(self) -> int | None:
        if self.inner is None:
            return 0 if not self.rest else None
        return None if self.rest else self.inner.shortest_completion()

    def _extensions(self) -> np.ndarray:
        """The tokens p + r allowed now: r is a prefix of a sentence of the inner grammar."""
        candidates = self.index.extending(self.rest)
        if self.inner is None:
            return candidates
        first = _allowed(self.inner, self.index.vocab.size)  # the inner grammar's first mask
        token_bytes, n = self.index.vocab.token_bytes, len(self.rest)
        keep = np.zeros(len(candidates), dtype=bool)
        for k, t in enumerate(candidates.tolist()):
            tail = token_bytes[t][n:]
            if not tail:
                keep[k] = True
                continue
            whole = self.index.token_of(tail)
            if whole is not None:  # r is a token: the inner mask says
                keep[k] = first[whole]
                continue
            lead = self.index.token_of(tail[:1])
            if lead is not None and not first[lead]:  # its first byte is refused already
                continue
            keep[k] = self._inner_takes(tail)
        return candidates[keep]

    def _prefixes(self) -> list[int]:
        """The tokens that spell a proper prefix of the rest, where the rest after them can
        be spelled too."""
        out = []
        for n in range(1, len(self.rest)):
            token = self.index.token_of(self.rest[:n])
            if token is not None and self.index.spell(self.rest[n:]) is not None:
                out.append(token)
        return out

    def _inner_takes(self, data: bytes) -> bool:
        spelled = self.index.spell(data)
        if spelled is None or not accept_all(self.inner, spelled):
            return False
        self.inner.rollback(len(spelled))
        return True

    def accept_token(self, token_id: int) -> bool:
        if not self.rest:
            if self.inner is not None and not self.inner.accept_token(token_id):
                return False
            self._history.append((b"", 1 if self.inner is not None else 0))
            return True
        vocab = self.index.vocab
        data = vocab.token_bytes[token_id] if 0 <= token_id < vocab.size else None
        if not data:
            return False
        if data.startswith(self.rest):
            tail = data[len(self.rest) :]
            fed = self.index.spell(tail) if tail and self.inner is not None else []
            if fed is None or (fed and not accept_all(self.inner, fed)):
                return False
            self._history.append((self.rest, len(fed)))
            self.rest = b""
            return True
        if self.rest.startswith(data) and self.index.spell(self.rest[len(data) :]) is not None:
            self._history.append((self.rest, 0))
            self.rest = self.rest[len(data) :]
            return True
        return False

    def is_terminated(self) -> bool:
        return not self.rest and self.inner is not None and self.inner.is_terminated()

    def rollback(self, n: int) -> None:
        if n > len(self._history):
            raise ValueError(f"cannot roll back {n} tokens: {len(self._history)} were accepted")
        if n <= 0:
            return
        undone = self._history[-n:]
        del self._history[-n:]
        fed = sum(count for _, count in undone)
        if fed:
            self.inner.rollback(fed)
        if undone[0][0]:  # the earliest undone token was a healing one
            self.rest = undone[0][0]

    def jump_forward(self) -> str:
        # Nothing is forced while healing: the model chooses how to re-spell the bytes.
        if self.rest or self.inner is None:
            return ""
        return self.inner.jump_forward()


def _allowed(matcher: Matcher, size: int) -> np.ndarray:
    """The tokens `matcher` allows next, as a bool per token id."""
    row = torch.zeros((size + 31) // 32, dtype=torch.int32)
    matcher.fill_bitmask(row)
    bits = np.unpackbits(row.numpy().view(np.uint8), bitorder="little")
    return bits[:size].astype(bool)
