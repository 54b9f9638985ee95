"""The compile cache: compiled grammars and stop-regex automata by job, within a budget of
entries and of memory, the least recently used evicted first.

Each grammar estimates its own memory (`memory_bytes()`). Lazy automata and EBNF grammars
grow as requests reach new states, so `trim` measures every entry again before it evicts;
the compiler measures each grammar it compiles before handing it over (`measured`), and every
entry at most once a second (after a compile while busy, on a timer while idle): measuring
them all after each compile held the GIL against the request about to use the new grammar.
Evicting drops the cache's reference: a grammar that running requests still use lives until
they finish, and the next request asking for it compiles it again. Without a total, N
distinct (hostile) constraints would hold N per-grammar budgets.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future


class GrammarCache:
    """Futures of compiled jobs (settled or still compiling) by key.

    `shared_bytes()` is what the entries share and eviction cannot free (the vocabulary's
    structures); it counts against the budget too. The most recently used entry is never
    evicted, so a grammar larger than the budget alone is kept rather than compiled again for
    every request."""

    def __init__(
        self,
        max_bytes: int,
        max_entries: int,
        shared_bytes: Callable[[], int] = lambda: 0,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._shared_bytes = shared_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, Future] = OrderedDict()
        self._sizes: dict[Hashable, int] = {}  # as last measured
        self._shared = 0
        self.evictions = 0

    def get(self, key: Hashable) -> Future | None:
        """The entry, now the most recently used; None when absent or when its compile
        failed (a failure is not kept: the next request tries again)."""
        with self._lock:
            future = self._entries.get(key)
            if future is None:
                return None
            if future.done() and future.exception() is not None:
                self._drop(key)
                return None
            self._entries.move_to_end(key)
            return future

    def put(self, key: Hashable, future: Future) -> None:
        with self._lock:
            self._entries[key] = future
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._evict_oldest()

    def discard(self, key: Hashable, future: Future) -> None:
        """Drop the entry if it is still `future` (its compile was abandoned)."""
        with self._lock:
            if self._entries.get(key) is future:
                self._drop(key)

    def trim(self) -> None:
        """Measure every compiled entry and evict the least recently used until the total
        fits the budget. Measuring runs outside the lock (a lazy automaton's count waits for
        its mask walks), so lookups never wait for it."""
        with self._lock:
            snapshot = list(self._entries.items())
        sizes = {key: _size(future) for key, future in snapshot}
        shared = self._shared_bytes()
        with self._lock:
            self._shared = shared
            for key, size in sizes.items():
                if key in self._entries:
                    self._sizes[key] = size
            self._evict_past_budget()

    def measured(self, key: Hashable, size: int) -> None:
        """Entry `key`'s compile, about to settle, takes `size` bytes: counted, and the least
        recently used evicted past the budget (the other entries as last measured)."""
        with self._lock:
            if key in self._entries:
                self._sizes[key] = size
            self._evict_past_budget()

    def memory_bytes(self) -> int:
        """The entries' and the shared structures' memory as last measured."""
        with self._lock:
            return self._total()

    def __len__(self) -> int:
        return len(self._entries)

    def _total(self) -> int:
        return self._shared + sum(self._sizes.values())

    def _evict_past_budget(self) -> None:
        """Under the lock: the least recently used go until the total fits (the most recent
        one stays, however large)."""
        while len(self._entries) > 1 and self._total() > self.max_bytes:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        self._drop(next(iter(self._entries)))
        self.evictions += 1

    def _drop(self, key: Hashable) -> None:
        del self._entries[key]
        self._sizes.pop(key, None)


def _size(future: Future) -> int:
    """A settled entry's memory; 0 while it compiles or when it failed."""
    if not future.done() or future.exception() is not None:
        return 0
    return future.result().memory_bytes()
