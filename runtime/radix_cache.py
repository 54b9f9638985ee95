"""Radix tree over token ids whose nodes own KV slots: prefix sharing across requests.

Each edge holds a run of tokens and the KV slots of those tokens. A request matches its
prompt against the tree, locks the matched path (so eviction cannot take it), computes only
the rest, and on finishing inserts its tokens; the tree then owns those slots. Unlocked
leaves are evicted least-recently-used first when the KV pool runs low.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

import torch

from braid.runtime.kv_cache import KVPool


class Node:
    __slots__ = ("children", "parent", "tokens", "slots", "lock_count", "last_used")

    def __init__(self, parent: Node | None, tokens: tuple[int, ...], slots: torch.Tensor):
        self.children: dict[int, Node] = {}  # keyed by the first token of the child's edge
        self.parent = parent
        self.tokens = tokens
        self.slots = slots
        self.lock_count = 0
        self.last_used = 0


class RadixCache:
    """The locking contract: `match_prefix` returns the deepest node covering the match; the
    caller `lock`s it while it uses those slots and `unlock`s it afterwards. Slots reachable
    from a locked node are never evicted."""

    def __init__(self, kv: KVPool, enabled: bool = True) -> None:
        self.kv = kv
        self.enabled = enabled
        self.root = Node(None, (), torch.empty(0, dtype=torch.int64))
        self.root.lock_count = 1  # the root is never evicted
        self._clock = itertools.count(1)
        self.num_cached_tokens = 0  # slots owned by the tree
        self.num_locked_tokens = 0  # of those, slots on locked paths

    def match_prefix(self, tokens: list[int]) -> tuple[torch.Tensor, Node]:
        """Slots of the longest cached prefix of `tokens`, and the node where it ends."""
        node, matched, i = self.root, [], 0
        if not self.enabled:
            return self.root.slots, self.root
        now = next(self._clock)
        while i < len(tokens) and (child := node.children.get(tokens[i])) is not None:
            n = common_prefix_length(child.tokens, tokens, i)
            if n < len(child.tokens):
                child = self._split(child, n)
            child.last_used = now
            matched.append(child.slots)
            node, i = child, i + n
        slots = torch.cat(matched) if matched else self.root.slots
        return slots, node

    def insert(self, tokens: list[int], slots: torch.Tensor) -> int:
        """Give the tree `slots` (one per token). Returns how many leading tokens were
        already cached: the caller's slots for those are duplicates and are freed here."""
        if not self.enabled:
            self.kv.free(slots)
            return 0
        node, i, now = self.root, 0, next(self._clock)
        while i < len(tokens) and (child := node.children.get(tokens[i])) is not None:
            n = common_prefix_length(child.tokens, tokens, i)
            if n < len(child.tokens):
                child = self._split(child, n)
            child.last_used = now
            node, i = child, i + n
        # Tokens [0, i) were already in the tree; the caller's copies of them are freed,
        # except slots that are the tree's own (a request that matched them shares them).
        dup = slots[:i]
        own = torch.cat([*self._path_slots(node)]) if i else dup
        extra = dup[dup != own]
        if extra.numel():
            self.kv.free(extra)
        if i < len(tokens):
            leaf = Node(node, tuple(tokens[i:]), slots[i:].clone())
            leaf.last_used = now
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

    @property
    def num_evictable_tokens(self) -> int:
        return self.num_cached_tokens - self.num_locked_tokens

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots from unlocked leaves, oldest first (fewer if not
        enough are evictable). Returns the number freed."""
        leaves = [
            (n.last_used, id(n), n) for n in self._nodes() if not n.children and n.lock_count == 0
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
            if parent is not self.root and not parent.children and parent.lock_count == 0:
                heapq.heappush(leaves, (parent.last_used, id(parent), parent))
        return freed

    def reset(self) -> None:
        """Drop every unlocked entry (flush_cache)."""
        self.evict(self.num_cached_tokens)

    def _split(self, child: Node, n: int) -> Node:
        """Cut child's edge after n tokens; return the new upper node."""
        upper = Node(child.parent, child.tokens[:n], child.slots[:n])
        upper.lock_count = child.lock_count
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

    def _nodes(self):
        stack = list(self.root.children.values())
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
