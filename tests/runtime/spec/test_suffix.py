"""SuffixStore: cross-request suffix drafts, checked against a brute-force scan."""

from __future__ import annotations

import random

from braid.runtime.spec.suffix import MAX_MATCH, MAX_OCCURRENCES, MIN_MATCH, SuffixStore


def reference(
    sequences: dict[int, list[int]],
    written: list[tuple[int, int]],
    context: list[int],
    length: int,
    width: int,
) -> list[list[int]]:
    """What SuffixStore.propose should return, by scanning every stored position: `written`
    lists (sequence id, end) in the order tokens were stored, so later is more recent."""
    for m in range(min(MAX_MATCH, len(context)), MIN_MATCH - 1, -1):
        followers = [
            tuple(sequences[s][end : end + length])
            for s, end in written
            if s in sequences
            and m <= end < len(sequences[s])
            and sequences[s][end - m : end] == context[-m:]
        ]
        if not followers:
            continue
        latest = {c: i for i, c in enumerate(followers)}
        ranked = sorted(latest, key=lambda c: (followers.count(c), latest[c]), reverse=True)
        paths: list[list[int]] = []
        for continuation in map(list, ranked):
            if not any(p[: len(continuation)] == continuation for p in paths):
                paths.append(continuation)
        return paths[:width]
    return []


def test_matches_brute_force_reference():
    rng = random.Random(0)
    checked_nonempty = 0
    for _ in range(300):
        store = SuffixStore()
        alphabet = rng.randint(2, 5)
        sequences: dict[int, list[int]] = {}
        written: list[tuple[int, int]] = []
        for _ in range(rng.randint(1, 6)):
            if sequences and rng.random() < 0.3:  # a running request's output grows
                seq_id = rng.choice(list(sequences))
                new = [rng.randrange(alphabet) for _ in range(rng.randint(0, 20))]
                store.extend(seq_id, new)
            else:
                new = [rng.randrange(alphabet) for _ in range(rng.randint(0, 40))]
                seq_id = store.add("scope", new)
                sequences[seq_id] = []
            start = len(sequences[seq_id])
            sequences[seq_id] += new
            written += [(seq_id, end) for end in range(start + 1, len(sequences[seq_id]) + 1)]
        for _ in range(5):
            if rng.random() < 0.5:  # long matches: a stored run plus maybe a tail
                tokens = rng.choice(list(sequences.values()))
                cut = rng.randint(0, len(tokens))
                context = tokens[max(0, cut - rng.randint(0, 24)) : cut]
            else:
                context = []
            context += [rng.randrange(alphabet) for _ in range(rng.randint(0, 3))]
            length, width = rng.randint(1, 6), rng.randint(1, 4)
            expected = reference(sequences, written, context, length, width)
            assert store.propose("scope", context, length, width) == expected, (
                sequences,
                context,
                length,
                width,
            )
            checked_nonempty += bool(expected)
    assert checked_nonempty > 500  # the comparison mostly had something to compare


def test_longest_match_beats_frequency():
    store = SuffixStore()
    for _ in range(5):
        store.add(None, [9, 1, 2, 7])
    store.add(None, [8, 1, 2, 5])
    assert store.propose(None, [8, 1, 2], 4, 3) == [[5]]
    assert store.propose(None, [3, 1, 2], 4, 3) == [[7], [5]]  # a 2-token match: by frequency


def test_frequency_then_recency():
    store = SuffixStore()
    for tokens in ([1, 2, 3], [1, 2, 4], [1, 2, 3], [1, 2, 5]):
        store.add(0, tokens)
    assert store.propose(0, [1, 2], 1, 3) == [[3], [5], [4]]


def test_long_match_found_past_frequent_short_ones():
    store = SuffixStore()
    run = list(range(100, 120))
    store.add(0, run + [7])
    for _ in range(3 * MAX_OCCURRENCES):  # push the run's last 2-gram out of its list
        store.add(0, run[-2:] + [8])
    assert store.propose(0, run, 1, 2) == [[7]]


def test_own_tokens_are_proposable_but_not_their_end():
    store = SuffixStore()
    running = [5, 6, 7, 5, 6]
    store.add(0, running)  # the request's own sequence: its end is no match
    assert store.propose(0, running, 3, 2) == [[7, 5, 6]]


def test_scopes_do_not_leak():
    store = SuffixStore()
    store.add("a", [1, 2, 3])
    store.add("b", [1, 2, 4])
    store.add(None, [1, 2, 5])
    assert store.propose("a", [1, 2], 2, 3) == [[3]]
    assert store.propose("b", [1, 2], 2, 3) == [[4]]
    assert store.propose(None, [1, 2], 2, 3) == [[5]]
    assert store.propose("c", [1, 2], 2, 3) == []


def test_lru_eviction_bounds_tokens():
    store = SuffixStore(max_tokens=30)
    first = store.add("a", [1, 2, 3] + [0] * 7)
    store.add("b", [4, 5, 6] + [0] * 7)
    store.add("a", [7, 8, 9] + [0] * 7)
    assert store.propose("a", [1, 2], 1, 1) == [[3]]  # uses `first`: now the second is oldest
    store.add("c", [10] * 10)
    assert len(store) == 30
    assert store.propose("b", [4, 5], 1, 1) == []
    assert store.propose("a", [1, 2], 1, 1) == [[3]]
    store.extend(first, [0] * 15)  # the most recent now, so the others go
    assert len(store) == 25
    assert store.propose("a", [7, 8], 1, 1) == []
    assert store.propose("c", [10, 10], 1, 1) == []
    assert store.propose("a", [1, 2], 1, 1) == [[3]]


def test_eviction_forgets_everything():
    rng = random.Random(1)
    store = SuffixStore(max_tokens=200)
    live: dict[int, list[int]] = {}
    for step in range(300):
        tokens = [rng.randrange(1000) for _ in range(rng.randint(1, 60))]
        if live and step % 3 == 0:
            seq_id = rng.choice(list(live))
            store.extend(seq_id, tokens)
            live[seq_id] += tokens
        else:
            live[store.add(step % 4, tokens)] = tokens
        assert len(store) <= 200
    for seq_id in live:  # evicted ones among them are ignored
        store.remove(seq_id)
    assert len(store) == 0
    assert store._ends == {}  # no index entries outlive their sequences


def test_evicted_sequence_not_proposed():
    store = SuffixStore(max_tokens=10)
    old = store.add(0, [1, 2, 3, 4, 5, 6])
    store.add(0, [7, 8, 9, 10, 11])
    assert store.propose(0, [1, 2], 3, 1) == []
    store.extend(old, [1, 2, 3])  # an evicted id is ignored
    assert len(store) == 5
    assert store.propose(0, [1, 2], 3, 1) == []


def test_extend_makes_new_tokens_proposable():
    store = SuffixStore()
    seq_id = store.add(0, [1, 2])
    assert store.propose(0, [1, 2], 3, 1) == []  # nothing follows yet
    store.extend(seq_id, [3, 4])
    assert store.propose(0, [1, 2], 3, 1) == [[3, 4]]
    assert store.propose(0, [9, 2, 3], 3, 1) == [[4]]  # an n-gram spanning the old end


def test_remove():
    store = SuffixStore()
    kept = store.add(0, [1, 2, 3])
    removed = store.add(0, [1, 2, 4])
    store.remove(removed)
    assert store.propose(0, [1, 2], 1, 2) == [[3]]
    assert len(store) == 3
    store.remove(removed)  # twice: ignored
    store.remove(kept)
    assert store.propose(0, [1, 2], 1, 2) == []
    assert len(store) == 0


def test_width_and_length():
    store = SuffixStore()
    for follower in range(10, 15):
        store.add(0, [1, 2, follower, follower + 1, follower + 2])
    paths = store.propose(0, [1, 2], 2, 3)
    assert paths == [[14, 15], [13, 14], [12, 13]]
    assert store.propose(0, [1, 2, 14], 10, 3) == [[15, 16]]  # stops at the sequence's end


def test_prefix_of_chosen_continuation_skipped():
    store = SuffixStore()
    store.add(0, [1, 2, 3])
    store.add(0, [1, 2, 3, 4])
    assert store.propose(0, [1, 2], 2, 2) == [[3, 4]]


def test_no_match():
    store = SuffixStore()
    assert store.propose(0, [1, 2], 3, 2) == []
    store.add(0, [1, 2, 3])
    assert store.propose(0, [2], 3, 2) == []  # one token is too short a match
    assert store.propose(0, [3, 1], 3, 2) == []
    assert store.propose(0, [1, 2], 0, 2) == []
    assert store.propose(0, [1, 2], 3, 0) == []
