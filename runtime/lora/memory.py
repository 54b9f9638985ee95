"""Which registered LoRA adapters hold their tensors in memory: a bound, least recently used
out, an evicted one loaded again from its directory when a request names it.

The adapter object stays registered across an eviction (only its `weights` go), so its
serial, and with it its radix-cache namespace, is the same after a reload: what was cached
under it still matches. Engine thread only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from braid.runtime.lora.adapter import LoraAdapter


class LoraMemory:
    def __init__(self, capacity: int, load: Callable[[str, str], LoraAdapter]) -> None:
        """`capacity`: adapters held at most besides those in use; `load(name, path)`: a
        fresh load of an adapter's files."""
        self.capacity = capacity
        self._load = load
        # Adapters holding their tensors, least recently used first.
        self._held: OrderedDict[LoraAdapter, None] = OrderedDict()
        self.num_reloads = 0

    @property
    def num_held(self) -> int:
        return len(self._held)

    def use(self, adapter: LoraAdapter, in_use: Callable[[], set[LoraAdapter]]) -> None:
        """Before a step can run a new request under `adapter` (or when it is registered): its
        tensors in memory, loaded again if they were evicted (ValueError if its files no
        longer load), it the most recently used, then `evict`."""
        if adapter not in self._held:
            if adapter.weights is None:
                adapter.weights = self._load(adapter.name, adapter.path).weights
                self.num_reloads += 1
            self._held[adapter] = None
        self._held.move_to_end(adapter)
        self.evict(lambda: in_use() | {adapter})

    def evict(self, in_use: Callable[[], set[LoraAdapter]]) -> None:
        """Drop the tensors of the least recently used adapters not in `in_use()` (asked
        only when over the capacity) until at most the capacity are held. Adapters in use
        are never evicted: while more than the capacity are, all of them are held, and the
        rest go when they are done (the engine calls this after each step)."""
        if len(self._held) <= self.capacity:
            return
        busy = in_use()
        for old in [a for a in self._held if a not in busy]:
            if len(self._held) <= self.capacity:
                break
            del self._held[old]
            old.weights = None  # the adapter stays registered, under the same serial

    def forget(self, adapter: LoraAdapter) -> None:
        """An unloaded adapter: no longer held."""
        self._held.pop(adapter, None)
