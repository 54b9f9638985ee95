"""Lazy regex grammars: grammars/regex/lazy_dfa.cpp's automaton, built once with the system C++
compiler and called through ctypes.

For regexes whose outlines index would be too large to build up front (a big JSON schema,
long counted strings): here a DFA state and its token mask are made the first time they are
reached, so compiling costs milliseconds whatever the size and each mask costs one walk of
the vocabulary's byte trie the first time, then a copy.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import weakref
from functools import lru_cache
from pathlib import Path

import torch

from braid.grammars.matcher import Grammar, Matcher, MatcherError, bitmask_words, set_bits
from braid.grammars.vocabulary import TokenVocabulary, per_vocabulary
from braid.kernels import native

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("lazy_dfa.cpp")
_FLAGS = ["-O2", "-shared", "-fPIC", "-std=c++17"]
_MAX_FORCED_BYTES = 4096
_MAX_TABLES = 200_000  # lazy_dfa.cpp's kMaxTransitionTables
STATE_MEMORY_MB = 128  # a grammar's DFA states, before it starts over (LazyRegexGrammar)
_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {
    "lazy_last_error": ([], ctypes.c_char_p),
    "lazy_vocab_new": ([_INT, ctypes.c_char_p, _P], _P),
    "lazy_vocab_free": ([_P], None),
    "lazy_grammar_new": ([_P, ctypes.c_char_p, _I64, _I64], _P),
    "lazy_grammar_free": ([_P], None),
    "lazy_start": ([_P], _INT),
    "lazy_advance": ([_P, _INT, ctypes.c_char_p, _I64], _INT),
    "lazy_fill": ([_P, _INT, _P], _INT),
    "lazy_fill_within": ([_P, _INT, _I64, _P], _INT),
    "lazy_shortest": ([_P, _INT], _I64),
    "lazy_is_final": ([_P, _INT], _INT),
    "lazy_forced": ([_P, _INT, ctypes.c_char_p, _INT, ctypes.POINTER(_INT)], _INT),
    "lazy_stats": ([_P, ctypes.POINTER(_I64)], None),
}


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The built library (a few seconds the first time on a machine); OSError naming what to
    install when there is no C++ compiler, or why the build failed. There is no fallback:
    without the library, constraints too large for an outlines index fail their request."""
    build_dir = Path.home() / ".cache" / "braid" / "grammars"
    try:
        return native.load(native.build("lazy_dfa", [SOURCE], _FLAGS, build_dir), _SIGNATURES)
    except OSError as e:
        raise OSError(
            f"lazy regex grammars (grammars/regex/lazy_dfa.cpp) are unavailable: {e}"
        ) from None


def lazy_available() -> bool:
    """Whether the lazy automaton's library builds and loads on this machine."""
    try:
        library()
    except OSError:
        return False
    return True


class LazyUnsupported(ValueError):
    """The lazy automaton cannot compile this regex (syntax it lacks, or past its NFA
    limits); an outlines index may still."""


def _error(lib: ctypes.CDLL) -> str:
    return lib.lazy_last_error().decode("utf-8", errors="replace")


class _Vocab:
    """The vocabulary's bytes and byte tries on the C++ side, one per vocabulary."""

    def __init__(self, vocab: TokenVocabulary) -> None:
        lib = library()
        data = b"".join(b or b"" for b in vocab.token_bytes)
        offsets = [0]
        for b in vocab.token_bytes:
            offsets.append(offsets[-1] + len(b or b""))
        offsets_t = torch.tensor(offsets, dtype=torch.int64)
        self.handle = lib.lazy_vocab_new(vocab.size, data, offsets_t.data_ptr())
        if not self.handle:
            raise ValueError(f"lazy grammar vocabulary: {_error(lib)}")
        weakref.finalize(self, lib.lazy_vocab_free, self.handle).atexit = False  # see renew
        # An estimate of what the C++ side holds: each token's std::string (its heap buffer
        # past 15 bytes), per length a bitmask of the plain tokens that short, and two tries
        # of at most one node per token byte (13 bytes a node, 4 a token).
        lengths = [len(b or b"") for b in vocab.token_bytes]
        longest = max(lengths, default=0)
        strings = sum(32 + (n + 1 if n > 15 else 0) for n in lengths)
        plain = (longest + 1) * (bitmask_words(vocab.size) * 4 + 24)
        self.memory_bytes = strings + plain + 13 * (len(data) + 2) + 4 * vocab.size


@per_vocabulary
def _vocab(vocab: TokenVocabulary) -> _Vocab:
    return _Vocab(vocab)


def vocab_memory_bytes(vocab: TokenVocabulary) -> int:
    """An estimate of the vocabulary structures every lazy grammar over `vocab` shares (built
    now if they were not)."""
    return _vocab(vocab).memory_bytes


class _Exhausted(Exception):
    """The automaton's states reached their memory budget."""


class LazyRegexGrammar(Grammar):
    """A regex's lazy automaton for one vocabulary, shared by its matchers.

    States cannot be freed one by one (matchers hold their ids), so when they reach
    `max_state_mb` the automaton starts over empty (`renew`) and each matcher replays its
    tokens into the new one when it next moves: memory stays bounded however many outputs a
    long-lived server constrains with one grammar. An output that alone needs more than the
    budget (a regex whose DFA blows up exponentially) fails with MatcherError.
    """

    def __init__(
        self, pattern: str, vocab: TokenVocabulary, max_state_mb: int = STATE_MEMORY_MB
    ) -> None:
        lib = library()
        self.lib = lib
        self.vocab = vocab
        self.source = pattern  # for error messages
        self.max_state_mb = max_state_mb
        self._vocab = _vocab(vocab)  # kept alive as long as the grammar
        self.generation = -1  # bumped by each new automaton; matchers compare theirs
        self._renew_lock = threading.Lock()
        self.renew()
        if self.start < 0:
            raise ValueError("regex matches nothing")
        self.words = bitmask_words(vocab.size)
        self.eos_ids = sorted(vocab.eos_token_ids)
        row = torch.empty(self.words, dtype=torch.int32)
        if self.fill(self.start, row) & 2 and not lib.lazy_is_final(self.handle, self.start):
            raise ValueError("regex matches nothing this vocabulary can spell")

    def renew(self) -> None:
        """Replace the automaton with an empty one, freeing the old one's states and masks."""
        with self._renew_lock:
            if self.generation >= 0:
                self._free()
            data = self.source.encode("utf-8")
            budget = self.max_state_mb << 20
            handle = self.lib.lazy_grammar_new(self._vocab.handle, data, len(data), budget)
            if not handle:
                raise LazyUnsupported(f"regex cannot be compiled: {_error(self.lib)}")
            self.handle = handle
            self._free = weakref.finalize(self, self.lib.lazy_grammar_free, handle)
            # Not at interpreter exit: a daemon compile thread may still be measuring the
            # automaton (trim), and freeing it under that thread corrupted the heap; the
            # process's memory goes with it anyway.
            self._free.atexit = False
            self.start = self.lib.lazy_start(handle)
            self.generation += 1

    def matcher(self) -> LazyMatcher:
        return LazyMatcher(self)

    def _check(self, code: int) -> int:
        if code == -4:
            raise _Exhausted(_error(self.lib))
        if code < -1:
            raise MatcherError(f"lazy grammar: {_error(self.lib)}")
        return code

    def fill(self, state: int, row: torch.Tensor) -> int:
        """Write state's mask (EOS excluded) into row; flags 1: final, 2: no token allowed."""
        return self._check(self.lib.lazy_fill(self.handle, state, row.data_ptr()))

    def fill_within(self, state: int, tokens_left: int, row: torch.Tensor) -> int:
        """Write state's mask steered to complete within tokens_left tokens (EOS excluded)
        into row; flags 1: final, 2: no token allowed, 4: steered (a token went)."""
        return self._check(
            self.lib.lazy_fill_within(self.handle, state, tokens_left, row.data_ptr())
        )

    def shortest(self, state: int) -> int | None:
        """An upper bound on the tokens completing the text from state (None: single-byte
        tokens cannot complete it)."""
        n = self.lib.lazy_shortest(self.handle, state)
        return None if n < 0 else n

    def advance(self, state: int, data: bytes) -> int:
        return self._check(self.lib.lazy_advance(self.handle, state, data, len(data)))

    def is_final(self, state: int) -> bool:
        return bool(self.lib.lazy_is_final(self.handle, state))

    def forced(self, state: int) -> bytes:
        buf = ctypes.create_string_buffer(_MAX_FORCED_BYTES)
        end = _INT()
        n = self.lib.lazy_forced(self.handle, state, buf, _MAX_FORCED_BYTES, ctypes.byref(end))
        return buf.raw[: self._check(n)]

    def stats(self) -> dict[str, int]:
        out = (_I64 * 4)()
        self.lib.lazy_stats(self.handle, out)
        return {"nfa_nodes": out[0], "dfa_states": out[1], "masks": out[2], "state_bytes": out[3]}

    def memory_bytes(self) -> int:
        """From the automaton's own counts: the NFA (~32 bytes a node with its side arrays),
        the states (the C++ side's exact figure), a 1 KB transition table per state at most
        (it drops them past _MAX_TABLES) and the cached masks."""
        with self._renew_lock:  # renew frees the handle
            s = self.stats()
        tables = min(s["dfa_states"], _MAX_TABLES) * 1048
        masks = s["masks"] * (self.words * 4 + 96)
        return 32 * s["nfa_nodes"] + s["state_bytes"] + tables + masks + len(self.source)


class LazyMatcher(Matcher):
    # Rollback reaches this many tokens back, as RegexMatcher's.
    MAX_ROLLBACK = 256

    def __init__(self, grammar: LazyRegexGrammar) -> None:
        self.grammar = grammar
        self.generation = grammar.generation  # of the automaton self.states belong to
        self.states = [grammar.start]  # one per accepted token (the last MAX_ROLLBACK + 1)
        self.accepted: list[bytes] = []  # every accepted token's bytes, to replay on renewal
        self.ended = False  # EOS accepted

    def fill_bitmask(self, row: torch.Tensor) -> None:
        g = self.grammar
        if self.ended:
            row.zero_()
            set_bits(row, g.eos_ids)
        elif self._at_state(g.fill, row) & 1:
            set_bits(row, g.eos_ids)

    def fill_bitmask_within(self, row: torch.Tensor, tokens_left: int) -> bool:
        g = self.grammar
        if self.ended:
            self.fill_bitmask(row)
            return False
        flags = self._at_state(g.fill_within, tokens_left, row)
        if flags & 1:
            set_bits(row, g.eos_ids)
        return bool(flags & 4)

    def shortest_completion(self) -> int | None:
        return 0 if self.ended else self._at_state(self.grammar.shortest)

    def accept_token(self, token_id: int) -> bool:
        g = self.grammar
        if self.ended:
            return False
        if token_id in g.vocab.eos_token_ids:
            self.ended = self._at_state(g.is_final)
            return self.ended
        data = g.vocab.token_bytes[token_id] if 0 <= token_id < g.vocab.size else None
        if not data:
            return False
        nxt = self._at_state(g.advance, data)
        if nxt < 0:
            return False
        self.states.append(nxt)
        self.accepted.append(data)
        if len(self.states) > self.MAX_ROLLBACK + 1:
            del self.states[0]
        return True

    def is_terminated(self) -> bool:
        if self.ended:
            return True
        row = torch.empty(self.grammar.words, dtype=torch.int32)
        # Final, and nothing may follow.
        return self._at_state(self.grammar.fill, row) == 3

    def rollback(self, n: int) -> None:
        if n and self.ended:
            self.ended = False
            n -= 1
        if n >= len(self.states):
            raise ValueError(
                f"cannot roll back {n} tokens (at most {self.MAX_ROLLBACK}, and no further "
                "than the start)"
            )
        if n:
            del self.states[-n:]
            del self.accepted[-n:]

    def jump_forward(self) -> str:
        if self.ended:
            return ""
        forced = self._at_state(self.grammar.forced)
        return forced.decode("utf-8", errors="ignore")  # a partial last character waits

    def _at_state(self, method, *args):
        """method(current state, *args); when the automaton is full, start it over once."""
        try:
            self._sync()
            return method(self.states[-1], *args)
        except _Exhausted:
            self.grammar.renew()
        try:
            self._sync()
            return method(self.states[-1], *args)
        except _Exhausted as e:
            raise MatcherError(
                f"{e} (grammar_state_memory_mb), even started over for this output alone"
            ) from None

    def _sync(self) -> None:
        """Replay the accepted tokens into a renewed automaton."""
        g = self.grammar
        if self.generation == g.generation:
            return
        state = g.start
        states = [state]
        for data in self.accepted:
            state = g.advance(state, data)
            states.append(state)
        self.states = states[-(self.MAX_ROLLBACK + 1) :]
        self.generation = g.generation
