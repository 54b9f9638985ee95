"""Regex grammars: outlines-core's token-level DFA index, with our matcher on top.

outlines-core compiles a regex against the vocabulary into an index mapping (state, token)
to the next state. The matcher keeps its own stack of states (so rollback is a pop), fills
masks through an outlines Guide positioned at the current state, and derives what the index
does not offer directly: which states can only end (termination) and the bytes forced next
(jump-forward), cached per state on the shared grammar; and, found once when first asked,
each state's fewest tokens to a final state (budgeted masks: documents that close).
"""

from __future__ import annotations

import pickle
import threading
from collections import deque

import torch
from outlines_core import Guide, Index

from braid.grammars.matcher import Grammar, Matcher, bitmask_words, set_bits
from braid.grammars.vocabulary import TokenVocabulary

_MAX_FORCED_BYTES = 4096  # one jump's text; the rest comes with the next


class RegexGrammar(Grammar):
    def __init__(self, index: Index, vocab: TokenVocabulary, source: str) -> None:
        self.index = index
        self.vocab = vocab
        self.source = source  # the regex, for error messages
        self.eos_id = min(vocab.eos_token_ids)  # the one outlines knows
        self.words = bitmask_words(vocab.size)
        # Per-state facts derived from the index, shared by every matcher of this grammar.
        self._lock = threading.Lock()
        self._index_bytes: int | None = None  # measured once, when first asked
        self._ends: dict[int, bool] = {}
        self._forced: dict[int, tuple[bytes, int] | None] = {}
        self._single_byte = {b[0]: i for i, b in enumerate(vocab.token_bytes) if b and len(b) == 1}
        self._tokens_left: dict[int, int] | None = None  # state -> fewest tokens to the end
        self._longest = 0  # the most of those
        self._moves: dict[int, dict[int, int]] = {}  # the index's, kept once those are found
        self._first_byte = [b[0] if b else -1 for b in vocab.token_bytes]

    def matcher(self) -> RegexMatcher:
        return RegexMatcher(self)

    def memory_bytes(self) -> int:
        """The index (outlines' maps of token -> next state per state take ~3x their
        serialized size, measured with malloc's counters), the per-token first bytes, the
        per-state facts found so far, and the index's moves once budgeted masks took them."""
        with self._lock:
            if self._index_bytes is None:
                self._index_bytes = 3 * len(pickle.dumps(self.index))
            facts = len(self._ends) + len(self._forced) + len(self._tokens_left or ())
            moves = sum(len(m) for m in self._moves.values())
        return (
            self._index_bytes
            + 8 * len(self._first_byte)
            + 160 * facts
            + 100 * moves  # a dict entry of two ints
            + len(self.source)
        )

    def tokens_left(self, state: int) -> int | None:
        """The fewest tokens from `state` to a final state (None: none reaches one)."""
        with self._lock:
            if self._tokens_left is None:
                self._moves = self.index.get_transitions()
                self._tokens_left = self._count_tokens_left()
                self._longest = max(self._tokens_left.values(), default=0)
            return self._tokens_left.get(state)

    def fitting(self, state: int, after: int) -> list[int] | None:
        """The tokens from `state` whose next state reaches a final one within `after` more
        tokens, or None where every token does (nothing to steer)."""
        if self.tokens_left(state) is None or after >= self._longest:
            return None
        left = self._tokens_left
        moves = self._moves.get(state, {})
        kept = [t for t, n in moves.items() if t != self.eos_id and left.get(n, after + 1) <= after]
        return None if len(kept) == sum(t != self.eos_id for t in moves) else kept

    def _count_tokens_left(self) -> dict[int, int]:
        """A breadth-first search back from the final states over the index's moves."""
        preds: dict[int, set[int]] = {}
        for state, moves in self._moves.items():
            for t, nxt in moves.items():
                if t != self.eos_id:
                    preds.setdefault(nxt, set()).add(state)
        left = dict.fromkeys(self.index.get_final_states(), 0)
        todo = deque(left)
        while todo:
            state = todo.popleft()
            for p in preds.get(state, ()):
                if p not in left:
                    left[p] = left[state] + 1
                    todo.append(p)
        return left

    def only_ends(self, state: int) -> bool:
        """Final, and nothing but EOS may follow."""
        with self._lock:
            if state not in self._ends:
                self._ends[state] = self.index.is_final_state(state) and all(
                    t == self.eos_id for t in self.index.get_allowed_tokens(state)
                )
            return self._ends[state]

    def forced_byte(self, state: int) -> tuple[bytes, int] | None:
        """(byte, next state) when every way forward from `state` starts with the same byte
        and ending here is not allowed; None otherwise."""
        with self._lock:
            if state not in self._forced:
                self._forced[state] = self._compute_forced(state)
            return self._forced[state]

    def _compute_forced(self, state: int) -> tuple[bytes, int] | None:
        if self.index.is_final_state(state):
            return None
        firsts = {self._first_byte[t] for t in self.index.get_allowed_tokens(state)}
        if len(firsts) != 1:
            return None
        (byte,) = firsts
        token = self._single_byte.get(byte)
        nxt = None if token is None else self.index.get_next_state(state, token)
        return None if nxt is None else (bytes([byte]), nxt)


class RegexMatcher(Matcher):
    """An outlines Guide (it writes masks fast) plus EOS handling for every EOS id."""

    # Rollback reaches this many tokens back (speculative drafts, jump-forward's retokenize).
    MAX_ROLLBACK = 256

    def __init__(self, grammar: RegexGrammar) -> None:
        self.grammar = grammar
        self.guide = Guide(grammar.index, max_rollback=self.MAX_ROLLBACK)
        self.ended = False  # EOS accepted

    @property
    def state(self) -> int:
        return self.guide.get_state()

    def fill_bitmask(self, row: torch.Tensor) -> None:
        g = self.grammar
        if self.ended or g.only_ends(self.state):
            row.zero_()
            set_bits(row, g.vocab.eos_token_ids)
            return
        self.guide.write_mask_into(row.data_ptr(), g.words, 4)
        if g.index.is_final_state(self.state):
            set_bits(row, g.vocab.eos_token_ids)  # outlines knows only one of them

    def fill_bitmask_within(self, row: torch.Tensor, tokens_left: int) -> bool:
        g = self.grammar
        need = None if self.ended else g.tokens_left(self.state)
        kept = (
            None if need is None or need > tokens_left else g.fitting(self.state, tokens_left - 1)
        )
        if kept is None:  # nothing to steer, or too late to close
            self.fill_bitmask(row)
            return False
        row.zero_()
        set_bits(row, kept)
        if g.index.is_final_state(self.state):
            set_bits(row, g.vocab.eos_token_ids)
        return True

    def shortest_completion(self) -> int | None:
        return 0 if self.ended else self.grammar.tokens_left(self.state)

    def accept_token(self, token_id: int) -> bool:
        g = self.grammar
        if self.ended:
            return False
        if token_id in g.vocab.eos_token_ids:
            self.ended = g.index.is_final_state(self.state)
            return self.ended
        if g.index.get_next_state(self.state, token_id) is None:
            return False
        self.guide.advance(token_id, return_tokens=False)
        return True

    def is_terminated(self) -> bool:
        return self.ended or self.grammar.only_ends(self.state)

    def rollback(self, n: int) -> None:
        if n and self.ended:
            self.ended = False
            n -= 1
        if n:
            try:
                self.guide.rollback_state(n)
            except ValueError:
                raise ValueError(
                    f"cannot roll back {n} tokens (at most {self.MAX_ROLLBACK}, and no further "
                    "than the start)"
                ) from None

    def jump_forward(self) -> str:
        if self.ended:
            return ""
        out, state = b"", self.state
        while len(out) < _MAX_FORCED_BYTES and (step := self.grammar.forced_byte(state)):
            byte, state = step
            out += byte
        return out.decode("utf-8", errors="ignore")  # a partial last character waits
