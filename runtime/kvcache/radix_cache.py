"""Radix tree over token ids whose nodes own KV slots: prefix sharing across requests.

Each edge holds a run of tokens and the KV slots of those tokens. A request matches its
prompt against the tree, locks the matched path (so eviction cannot take it), computes only
the rest, and on finishing inserts its tokens; the tree then owns those slots. Unlocked
leaves are evicted least-recently-used first when the KV pool runs low.

Prefixes are shared only within a namespace (a request's cache_salt): each namespace has a
subtree of its own, so a request never matches, and never learns of, what was computed in
another. Locking and eviction do not care: the LRU order runs over all namespaces together.

A program state between two of its requests (while a tool runs, say) holds a lease on its
prefix (runtime/kvcache/leases.py): eviction takes unleased leaves first and breaks leases only when
they are all gone, least urgent first. Unlike a lock, a lease never stops eviction.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterator, Sequence

import torch

from braid.runtime.kvcache.leases import Lease, Leases
from braid.runtime.kvcache.pool import KVPool


class Node:
    __slots__ = ("children", "parent", "tokens", "slots", "lock_count", "lease_count", "last_used")

    def __init__(self, parent: Node | None, tokens: tuple[int, ...], slots: torch.Tensor):
        self.children: dict[int, Node] = {}  # keyed by the first token of the child's edge
        self.parent = parent
        self.tokens = tokens
        self.slots = slots
        self.lock_count = 0
        self.lease_count = 0  # leases on this node or below it
        self.last_used = 0


class NamespaceRoot(Node):
    """The top of one namespace's subtree: no tokens of its own, the cache's root above it."""

    __slots__ = ("namespace",)

    def __init__(self, root: Node, namespace: Hashable) -> None:
        super().__init__(root, (), root.slots)
        self.namespace = namespace


class RadixCache:
    """The locking contract: `match_prefix` returns the deepest node covering the match; the
    caller `lock`s it while it uses those slots and `unlock`s it afterwards. Slots reachable
    from a locked node are never evicted.

    A namespace is any hashable key; None is the one requests without a salt share."""

    def __init__(self, kv: KVPool, enabled: bool = True) -> None:
        self.kv = kv
        self.enabled = enabled
        self.root = Node(None, (), torch.empty(0, dtype=torch.int64))
        self.root.lock_count = 1  # the root is never evicted
        # Each namespace's subtree, while it holds tokens: the first insert into a namespace
        # makes its root, and evicting its last token drops it (salts are the clients' to
        # choose: an emptied namespace must not stay behind).
        self._roots: dict[Hashable, NamespaceRoot] = {}
        self._clock = itertools.count(1)
        self.num_cached_tokens = 0  # slots owned by the tree
        self.num_locked_tokens = 0  # of those, slots on locked paths
        self.leases = Leases()
        self.num_leased_tokens = 0  # slots on leased paths

    def cached_length(self, tokens: list[int], namespace: Hashable = None) -> int:
        """How many leading tokens of `tokens` are cached in `namespace`. A read: the tree
        and its LRU order are left as they are (the scheduler asks it of every waiting
        request each step)."""
        if not self.enabled:
            return 0
        node, i = self._roots.get(namespace, self.root), 0
        while i < len(tokens) and (child := node.children.get(tokens[i])) is not None:
            n = common_prefix_length(child.tokens, tokens, i)
            i += n
            if n < len(child.tokens):
                break
            node = child
        return i

    def match_prefix(
        self, tokens: list[int], namespace: Hashable = None
    ) -> tuple[torch.Tensor, Node]:
        """Slots of the longest prefix of `tokens` cached in `namespace`, and the node where
        it ends (the root when nothing matched: a namespace's own root is never locked, so
        that it is empty only when nothing in it is in use). The path counts as used now
        (LRU), and an edge the match ends inside is split there: call it to use the
        prefix, `cached_length` to ask about it."""
        if not self.enabled:
            return self.root.slots, self.root
        node, i = self._descend(tokens, namespace)
        if i == 0:
            return self.root.slots, self.root
        return torch.cat(self._path_slots(node)), node

    def insert(self, tokens: list[int], slots: torch.Tensor, namespace: Hashable = None) -> int:
        """Give the tree `slots` (one per token) under `namespace`. Returns how many leading
        tokens were already cached there: the caller's slots for those are duplicates and are
        freed here."""
        if not self.enabled:
            self.kv.free(slots)
            return 0
        node, i = self._descend(tokens, namespace)
        # Tokens [0, i) were already in the tree; the caller's copies of them are freed,
        # except slots that are the tree's own (a request that matched them shares them).
        dup = slots[:i]
        own = torch.cat([*self._path_slots(node)]) if i else dup
        extra = dup[dup != own]
        if extra.numel():
            self.kv.free(extra)
        if i < len(tokens):
            if node is self.root:  # the namespace's first tokens
                node = self._roots[namespace] = NamespaceRoot(self.root, namespace)
            leaf = Node(node, tuple(tokens[i:]), slots[i:].clone())
            leaf.last_used = next(self._clock)
            node.children[tokens[i]] = leaf
            self.num_cached_tokens += len(tokens) - i
        return i

    def lock(self, node: Node) -> None:
        while node is not None:
            if node.lock_count == 0:
                self.num_locked_tokens += len(node.tokens)
            node.lock_count += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node is not None:
            node.lock_count -= 1
            if node.lock_count == 0:
                self.num_locked_tokens -= len(node.tokens)
            node = node.parent

    def lease(
        self,
        key: Hashable,
        tokens: list[int],
        namespace: Hashable,
        ttl_s: float,
        max_leased_tokens: int,
    ) -> None:
        """Lease the cached prefix of `tokens` to `key` (a program state) for `ttl_s` seconds,
        in place of what `key` held. Leased slots stay within `max_leased_tokens`: the least
        urgent other leases are broken to make the new one fit, and one that cannot fit even
        alone is not taken."""
        self.release(key)
        if not self.enabled or max_leased_tokens <= 0:
            return
        node, i = self._descend(tokens, namespace)
        if i == 0:
            return
        self._add_lease(node, +1)
        self.leases.add(Lease(key, node, ttl_s))
        while self.num_leased_tokens > max_leased_tokens:
            victim = self.leases.least_urgent(exclude=key) or self.leases.get(key)
            self.release(victim.key)

    def release(self, key: Hashable) -> None:
        """Drop `key`'s lease, if it holds one (its slots stay cached, unleased)."""
        lease = self.leases.pop(key)
        if lease is not None:
            self._add_lease(lease.node, -1)

    def _add_lease(self, node: Node, delta: int) -> None:
        while node is not None and node is not self.root:
            if node.lease_count == 0 or node.lease_count + delta == 0:
                self.num_leased_tokens += delta * len(node.tokens)
            node.lease_count += delta
            node = node.parent

    @property
    def num_evictable_tokens(self) -> int:
        return self.num_cached_tokens - self.num_locked_tokens

    def evict(self, num_tokens: int, break_leases: bool = True) -> int:
        """Free at least `num_tokens` slots from unlocked leaves, oldest first (fewer if not
        enough are evictable): unleased ones, then, if `break_leases`, the slots of leases
        broken least urgent first (expired leases are broken in any case). Returns the
        number freed."""
        for key in self.leases.expired():
            self.release(key)
        freed = self._evict_unleased(num_tokens)
        while freed < num_tokens and break_leases and (victim := self.leases.least_urgent()):
            self.release(victim.key)
            freed += self._evict_unleased(num_tokens - freed)
        return freed

    def _evict_unleased(self, num_tokens: int) -> int:
        leaves = [
            (n.last_used, id(n), n)
            for n in self._nodes()
            if not n.children and n.lock_count == 0 and n.lease_count == 0
        ]
        heapq.heapify(leaves)
        freed = 0
        while freed < num_tokens and leaves:
            _, _, leaf = heapq.heappop(leaves)
            self.kv.free(leaf.slots)
            freed += len(leaf.tokens)
            self.num_cached_tokens -= len(leaf.tokens)
            parent = leaf.parent
            del parent.children[leaf.tokens[0]]
            if parent.children or parent.lock_count or parent.lease_count:
                continue
            if isinstance(parent, NamespaceRoot):  # the namespace's last tokens went
                del self._roots[parent.namespace]
            else:
                heapq.heappush(leaves, (parent.last_used, id(parent), parent))
        return freed

    def reset(self) -> None:
        """Drop every lease and every unlocked entry (flush_cache)."""
        self.evict(self.num_cached_tokens)

    def _descend(self, tokens: list[int], namespace: Hashable) -> tuple[Node, int]:
        """Follow `tokens` down `namespace`'s subtree as far as it holds them, marking the
        path used and splitting the edge the match ends inside (so a node ends exactly
        there). Returns the node reached (the root for a namespace not held) and how many
        tokens matched."""
        node, i, now = self._roots.get(namespace, self.root), 0, next(self._clock)
        while i < len(tokens) and (child := node.children.get(tokens[i])) is not None:
            n = common_prefix_length(child.tokens, tokens, i)
            if n < len(child.tokens):
                child = self._split(child, n)
            child.last_used = now
            node, i = child, i + n
        return node, i

    def _split(self, child: Node, n: int) -> Node:
        """Cut child's edge after n tokens; return the new upper node."""
        upper = Node(child.parent, child.tokens[:n], child.slots[:n])
        upper.lock_count = child.lock_count
        upper.lease_count = child.lease_count
        upper.last_used = child.last_used
        upper.children[child.tokens[n]] = child
        child.parent.children[child.tokens[0]] = upper
        child.parent = upper
        child.tokens, child.slots = child.tokens[n:], child.slots[n:]
        return upper

    def _path_slots(self, node: Node) -> list[torch.Tensor]:
        path = []
        while node is not self.root:
            path.append(node.slots)
            node = node.parent
        return path[::-1]

    def _nodes(self) -> Iterator[Node]:
        """Every node that holds tokens, in all namespaces."""
        stack = [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())


def common_prefix_length(a: Sequence[int], b: Sequence[int], b_start: int = 0) -> int:
    """How many leading tokens of `a` equal those of `b` from `b_start` on."""
    n = min(len(a), len(b) - b_start)
    for j in range(n):
        if a[j] != b[b_start + j]:
            return j
    return n
