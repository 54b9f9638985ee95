"""Program leases: which cached prefixes live program states will extend next.

Between two requests of a program state (a tool call, the program's own code) nothing locks
its prefix, so plain LRU eviction would drop it under pressure and the next turn would
compute it again. The interpreter names each state (a program id on its requests); when a
request with one finishes, the state's prefix is leased to it in the radix cache until the
state's next request, its release (the program finished, failed, or its fork was joined) or
the lease's expiry, so that a program that never continues cannot pin memory for ever.

Urgency orders which lease breaks first when nothing unleased is left to evict: an expired
lease, then a state waiting on something else (a tool), most recently renewed first (its
wait began last, so with tools of like latency it is needed last), and last a state whose
next request is already queued.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from braid.runtime.kvcache.radix_cache import Node


@dataclass
class Lease:
    key: Hashable  # (cache namespace, program id)
    node: Node  # the end of the leased prefix
    ttl_s: float
    renewed: float = field(default_factory=time.monotonic)
    queued: bool = False  # the state's next request waits in the scheduler's queue

    @property
    def expired(self) -> bool:
        return time.monotonic() - self.renewed > self.ttl_s


class Leases:
    """The cache's leases by key; RadixCache keeps the nodes' counts in step with them."""

    def __init__(self) -> None:
        self._by_key: dict[Hashable, Lease] = {}
        # A request of a state that holds no lease yet may be queued: remembered, so that
        # the lease its finish takes starts queued if another request is still waiting.
        self._queued: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._by_key

    def add(self, lease: Lease) -> None:
        lease.queued = self._queued.get(lease.key, 0) > 0
        self._by_key[lease.key] = lease

    def get(self, key: Hashable) -> Lease | None:
        return self._by_key.get(key)

    def pop(self, key: Hashable) -> Lease | None:
        return self._by_key.pop(key, None)

    def queue(self, key: Hashable, delta: int) -> None:
        """A request of state `key` joined (+1) or left (-1) the scheduler's queue."""
        n = self._queued.get(key, 0) + delta
        if n > 0:
            self._queued[key] = n
        else:
            self._queued.pop(key, None)
        if (lease := self._by_key.get(key)) is not None:
            lease.queued = n > 0
            lease.renewed = time.monotonic()

    def expired(self) -> list[Hashable]:
        return [key for key, lease in self._by_key.items() if lease.expired]

    def least_urgent(self, exclude: Hashable = None) -> Lease | None:
        """The lease to break first (None when there is no other)."""
        candidates = (lease for key, lease in self._by_key.items() if key != exclude)
        return min(candidates, key=lambda x: (not x.expired, x.queued, -x.renewed), default=None)
