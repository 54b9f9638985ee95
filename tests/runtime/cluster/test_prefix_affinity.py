"""Prefix affinity: prompts sharing a prefix go to one engine, new prefixes spread over the
engines, a hot prefix spills to an idle engine, and the memory stays bounded."""

from __future__ import annotations

import pytest

from braid.runtime.cluster.affinity import AffinityConfig, PrefixAffinity

PREFIXES = [f"Example {k}: " + "the quick brown fox jumps over the lazy dog " * 8 for k in range(4)]


def test_prompts_sharing_a_prefix_go_to_the_same_engine():
    affinity = PrefixAffinity(2)
    first = {k: affinity.acquire(p + "Q0") for k, p in enumerate(PREFIXES)}
    assert sorted(first.values()) == [0, 0, 1, 1]  # new prefixes spread over the engines
    for k in first:
        affinity.release(first[k])
    for j in range(1, 6):
        for k, prefix in enumerate(PREFIXES):
            engine = affinity.acquire(prefix + f"Q{j}")
            assert engine == first[k]
            affinity.release(engine)


def test_a_hot_prefix_spills_to_the_least_loaded_engine():
    affinity = PrefixAffinity(2, AffinityConfig(balance_slack=2))
    held = [affinity.acquire(PREFIXES[0] + f"Q{j}") for j in range(6)]
    # The holder takes requests until it has 2 more in flight than the idle engine; then that
    # one holds the prefix too, and the least loaded of the two takes the next ones.
    assert held == [0, 0, 0, 1, 1, 1]
    for engine in held:
        affinity.release(engine)
    assert affinity.loads == [0, 0]


def test_unhealthy_engines_are_skipped():
    affinity = PrefixAffinity(3)
    engine = affinity.acquire(PREFIXES[0])
    affinity.release(engine)
    healthy = [i != engine for i in range(3)]
    assert affinity.acquire(PREFIXES[0] + "more", healthy) != engine
    with pytest.raises(RuntimeError, match="no healthy engine"):
        affinity.acquire(PREFIXES[0], [False] * 3)


def test_memory_is_bounded():
    affinity = PrefixAffinity(2, AffinityConfig(block_chars=8, max_entries=50))
    for k in range(100):
        affinity.release(affinity.acquire(f"prompt number {k} " * 4))
    assert len(affinity._holders) == 50
    assert sum(affinity.num_blocks) == 50  # each remembered block is held by one engine here


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="block_chars"):
        AffinityConfig(block_chars=0)
    with pytest.raises(ValueError, match="at least one engine"):
        PrefixAffinity(0)
