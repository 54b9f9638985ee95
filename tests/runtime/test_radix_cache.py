"""The radix cache on its own: matching, splitting, sharing, locking, LRU eviction, no leaks."""

from __future__ import annotations

import random

import torch

from braid.runtime.kv_cache import KVPool
from braid.runtime.radix_cache import RadixCache


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
