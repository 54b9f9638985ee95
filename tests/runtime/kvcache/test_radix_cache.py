"""The radix cache on its own: matching, splitting, sharing, locking, LRU eviction, no leaks."""

from __future__ import annotations

import random

import torch

from braid.runtime.kvcache.pool import KVPool
from braid.runtime.kvcache.radix_cache import RadixCache


def make(num_slots: int = 64, enabled: bool = True) -> tuple[KVPool, RadixCache]:
    kv = KVPool(1, num_slots, 1, 2, torch.float32, "cpu")
    return kv, RadixCache(kv, enabled)


def accounted(kv: KVPool, cache: RadixCache, held: int = 0) -> bool:
    return kv.num_free_slots + cache.num_cached_tokens + held == kv.num_slots


def test_match_after_insert_returns_the_same_slots():
    kv, cache = make()
    slots = kv.allocate(6)
    assert cache.insert([1, 2, 3, 4, 5, 6], slots) == 0
    got, _ = cache.match_prefix([1, 2, 3, 9])
    assert got.tolist() == slots[:3].tolist()
    got, _ = cache.match_prefix([1, 2, 3, 4, 5, 6, 7])
    assert got.tolist() == slots.tolist()
    assert cache.match_prefix([7, 1])[0].numel() == 0
    assert accounted(kv, cache)


def test_insert_of_a_shared_prefix_frees_the_duplicate_slots():
    kv, cache = make()
    a = kv.allocate(5)
    cache.insert([1, 2, 3, 4, 5], a)
    b = kv.allocate(4)  # computed separately, before a was cached
    assert cache.insert([1, 2, 3, 8], b) == 3
    assert cache.num_cached_tokens == 6
    assert accounted(kv, cache)
    got, _ = cache.match_prefix([1, 2, 3, 8])
    assert got.tolist() == a[:3].tolist() + b[3:].tolist()


def test_slots_taken_from_a_match_are_not_freed_twice():
    kv, cache = make()
    a = kv.allocate(4)
    cache.insert([1, 2, 3, 4], a)
    prefix, node = cache.match_prefix([1, 2, 3, 4, 5, 6])
    cache.lock(node)
    rest = kv.allocate(2)
    cache.insert([1, 2, 3, 4, 5, 6], torch.cat([prefix, rest]))
    cache.unlock(node)
    assert cache.num_cached_tokens == 6 and accounted(kv, cache)


def test_locked_paths_survive_eviction_and_lru_goes_first():
    kv, cache = make()
    for toks in ([1, 2, 3], [4, 5, 6], [7, 8, 9]):
        cache.insert(toks, kv.allocate(3))
    cache.match_prefix([4, 5, 6])  # touch: now the most recent besides the locked one
    _, locked = cache.match_prefix([7, 8, 9])
    cache.lock(locked)
    assert cache.num_evictable_tokens == 6
    assert cache.evict(3) == 3
    assert cache.match_prefix([1, 2, 3])[0].numel() == 0  # oldest went first
    assert cache.match_prefix([4, 5, 6])[0].numel() == 3
    assert cache.evict(100) == 3
    assert cache.match_prefix([7, 8, 9])[0].numel() == 3  # locked
    cache.unlock(locked)
    cache.reset()
    assert cache.num_cached_tokens == 0 and kv.num_free_slots == kv.num_slots


def test_disabled_cache_matches_nothing_and_frees_on_insert():
    kv, cache = make(enabled=False)
    cache.insert([1, 2, 3], kv.allocate(3))
    assert cache.match_prefix([1, 2, 3])[0].numel() == 0
    assert kv.num_free_slots == kv.num_slots


def test_random_workload_against_a_dict_model():
    """Random inserts, matches and evictions checked against a plain set of sequences."""
    rng = random.Random(0)
    kv, cache = make(num_slots=400)
    content: dict[tuple[int, ...], int] = {}  # every cached token sequence prefix -> its slot
    for _ in range(300):
        toks = [rng.randrange(4) for _ in range(rng.randrange(1, 12))]
        prefix, node = cache.match_prefix(toks)
        # The match is exactly the longest prefix the model knows, with the same slots.
        n = max(k for k in range(len(toks) + 1) if tuple(toks[:k]) in content or k == 0)
        assert prefix.numel() == n
        assert prefix.tolist() == [content[tuple(toks[: k + 1])] for k in range(n)]
        if rng.random() < 0.2:
            cache.evict(rng.randrange(1, 20))
            content = {}
            for seq_node in cache._nodes():  # rebuild the model from the tree's paths
                path = []
                walk = seq_node
                while walk is not cache.root:
                    path = list(zip(walk.tokens, walk.slots.tolist(), strict=True)) + path
                    walk = walk.parent
                for k in range(len(path)):
                    content[tuple(t for t, _ in path[: k + 1])] = path[k][1]
            continue
        need = len(toks) - n
        if not kv.can_allocate(need):
            cache.evict(need)
            continue
        cache.lock(node)
        slots = torch.cat([prefix, kv.allocate(need)])
        cache.insert(toks, slots)
        cache.unlock(node)
        for k in range(len(toks)):
            content.setdefault(tuple(toks[: k + 1]), int(slots[k]))
        assert accounted(kv, cache)
    assert cache.num_locked_tokens == 0


# ---- namespaces (a request's cache_salt) ------------------------------------------------------


def test_namespaces_never_match_each_other():
    kv, cache = make()
    a = kv.allocate(4)
    cache.insert([1, 2, 3, 4], a, "a")
    assert cache.match_prefix([1, 2, 3, 4, 5], "a")[0].tolist() == a.tolist()
    for other in ("b", None):
        prefix, node = cache.match_prefix([1, 2, 3, 4, 5], other)
        assert prefix.numel() == 0 and node is cache.root
    # The same tokens under another namespace are its own: none taken as a duplicate.
    b = kv.allocate(4)
    assert cache.insert([1, 2, 3, 4], b, "b") == 0
    assert cache.match_prefix([1, 2, 3, 4], "b")[0].tolist() == b.tolist()
    assert cache.match_prefix([1, 2, 3, 4], "a")[0].tolist() == a.tolist()
    assert cache.num_cached_tokens == 8 and accounted(kv, cache)


def test_eviction_is_lru_over_all_namespaces_and_drops_emptied_ones():
    kv, cache = make()
    for namespace in ("a", "b", None):
        cache.insert([1, 2, 3], kv.allocate(3), namespace)
    cache.match_prefix([1, 2, 3], "a")  # touch: "b" is now the oldest, then None
    assert cache.evict(3) == 3
    assert set(cache._roots) == {"a", None}
    assert cache.evict(3) == 3
    assert set(cache._roots) == {"a"}
    assert cache.match_prefix([1, 2, 3], "a")[0].numel() == 3
    cache.reset()
    assert not cache._roots and cache.num_cached_tokens == 0
    assert kv.num_free_slots == kv.num_slots


def test_locks_hold_within_their_namespace():
    kv, cache = make()
    cache.insert([1, 2, 3, 4], kv.allocate(4), "a")
    cache.insert([1, 2, 3, 4], kv.allocate(4), "b")
    prefix, node = cache.match_prefix([1, 2, 3, 9], "a")  # splits a's edge after 3
    cache.lock(node)
    assert cache.num_locked_tokens == 3 and cache.num_evictable_tokens == 5
    assert cache.evict(100) == 5  # b's four and a's unlocked fourth token
    assert set(cache._roots) == {"a"}
    assert cache.match_prefix([1, 2, 3], "a")[0].tolist() == prefix.tolist()
    # Another namespace's request with the same tokens computes and caches its own copy.
    mine = kv.allocate(3)
    assert cache.insert([1, 2, 3], mine, "b") == 0
    assert cache.match_prefix([1, 2, 3], "b")[0].tolist() == mine.tolist()
    assert accounted(kv, cache)
    cache.unlock(node)
    assert cache.num_locked_tokens == 0 and cache.root.lock_count == 1
    cache.reset()
    assert not cache._roots and kv.num_free_slots == kv.num_slots


def test_a_request_that_matched_nothing_locks_the_root():
    """Its namespace's root is never locked, so a namespace is empty only when unused."""
    kv, cache = make()
    cache.insert([1, 2], kv.allocate(2), "a")
    prefix, node = cache.match_prefix([5, 6], "a")
    assert prefix.numel() == 0 and node is cache.root
    cache.lock(node)
    cache.reset()
    assert not cache._roots
    cache.insert([5, 6], kv.allocate(2), "a")  # the request finishes: the namespace is back
    cache.unlock(node)
    assert cache.root.lock_count == 1 and cache.num_evictable_tokens == 2
    cache.reset()
    assert not cache._roots and kv.num_free_slots == kv.num_slots


def test_random_workload_in_several_namespaces_against_a_dict_model():
    """Random inserts, matches and evictions in four namespaces, checked against a plain map
    from (namespace, cached sequence) to its last token's slot; every slot is owned once."""
    rng = random.Random(1)
    kv, cache = make(num_slots=300)
    namespaces = [None, "a", "b", ("adapter", "a")]
    content: dict[tuple, int] = {}
    for _ in range(400):
        namespace = rng.choice(namespaces)
        toks = [rng.randrange(3) for _ in range(rng.randrange(1, 10))]
        prefix, node = cache.match_prefix(toks, namespace)
        n = max(k for k in range(len(toks) + 1) if k == 0 or (namespace, *toks[:k]) in content)
        assert prefix.tolist() == [content[(namespace, *toks[: k + 1])] for k in range(n)]
        if rng.random() < 0.2:
            cache.evict(rng.randrange(1, 30))
            content = {}
            for root in cache._roots.values():  # rebuild the model from the tree's paths
                stack = [(child, ()) for child in root.children.values()]
                while stack:
                    child, above = stack.pop()
                    for t, slot in zip(child.tokens, child.slots.tolist(), strict=True):
                        above = (*above, t)
                        content[(root.namespace, *above)] = slot
                    stack += [(c, above) for c in child.children.values()]
            continue
        need = len(toks) - n
        if not kv.can_allocate(need):
            cache.evict(need)
            continue
        cache.lock(node)
        slots = torch.cat([prefix, kv.allocate(need)])
        cache.insert(toks, slots, namespace)
        cache.unlock(node)
        for k in range(len(toks)):
            content.setdefault((namespace, *toks[: k + 1]), int(slots[k]))
        owned = torch.cat([n.slots for n in cache._nodes()]).tolist()
        assert len(owned) == len(set(owned)) == cache.num_cached_tokens
        assert accounted(kv, cache)
    assert cache.num_locked_tokens == 0
    cache.reset()
    assert not cache._roots and kv.num_free_slots == kv.num_slots
