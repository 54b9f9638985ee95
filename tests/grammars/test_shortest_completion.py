"""The lazy automaton's shortest completions and budgeted masks, against a reference twin:
a breadth-first search over strings with the `regex` module's partial matching."""

from __future__ import annotations

import random
from functools import cache

import pytest
import regex as reference_re
import torch

from braid import grammars
from braid.grammars.matcher import allowed_token_ids
from braid.grammars.regex.grammar import RegexGrammar
from braid.grammars.regex.lazy import LazyRegexGrammar
from braid.grammars.regex.outlines_index import build_index
from braid.grammars.vocabulary import TokenVocabulary

# (pattern, the characters its shortest completions are spelled with)
CASES = [
    (r"ab|cde", "abcde"),
    (r"(ab)+c?", "abc"),
    (r"[ab]{2,5}c", "abc"),
    (r"a{17,20}b", "ab"),  # counted units (past 16 repetitions)
    (r"(x|yz)*w", "xyzw"),
    # Free strings: every plain byte leads on alike (masks by length), counted and not.
    (r'\{"s":"[^"\\\x00-\x1f]{0,30}"\}', '{}":sa'),
    (r'"[^"\\\x00-\x1f]*"x', '"xa'),
    # A length lookahead: the JSON-schema string's regex (given as its schema).
    ({"type": "string", "pattern": "^(ab|cde)+$", "minLength": 5, "maxLength": 7}, 'abcde"'),
    (r'\{"k":(true|false|[0-9]{1,3}),"s":"[a-z]{0,20}"\}', '{}":,kstrufale0'),
]
# And for the masks' tests, which need no reference search: a free string with a minimum
# length, where plain tokens of each length lead to states needing different counts.
STEERED = [*CASES, (r'\{"s":"[^"\\\x00-\x1f]{20,30}"\}', "")]


def _pattern(vocab, case: str | dict) -> str:
    if isinstance(case, str):
        return case
    grammar = grammars.compile(grammars.JsonSchema.of(case), vocab)
    assert "(?=" in grammar.source
    return grammar.source


@cache
def reference_shortest(pattern: str, prefix: str, alphabet: str, limit: int = 30) -> int | None:
    """The fewest characters that complete `prefix` to a full match (None: none within
    `limit`), by breadth-first search over the continuations that can still match."""
    compiled = reference_re.compile(pattern)
    level = [""]
    for n in range(limit + 1):
        if any(compiled.fullmatch(prefix + s) for s in level):
            return n
        level = sorted(
            {
                s + c
                for s in level
                for c in alphabet
                if compiled.fullmatch(prefix + s + c, partial=True)
            }
        )
        if not level:
            return None
    return None


def _text(vocab: TokenVocabulary, ids: list[int]) -> str:
    return b"".join(vocab.token_bytes[t] for t in ids).decode()


def _ascii(vocab: TokenVocabulary, ids) -> list[int]:
    return [t for t in ids if vocab.token_bytes[t] and vocab.token_bytes[t].isascii()]


# Every byte a token and no other: a completion's tokens are its bytes.
BYTES = TokenVocabulary(tuple(bytes([b]) for b in range(256)) + (None,), frozenset({256}), "bytes")


def _walks(vocab, pattern: str, steps: int = 8, seed: int = 0):
    """(matcher, tokens so far) along a random walk of allowed ASCII tokens."""
    rng = random.Random(seed)
    grammar = LazyRegexGrammar(pattern, vocab)
    m = grammar.matcher()
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    taken: list[int] = []
    for _ in range(steps):
        yield m, list(taken)
        m.fill_bitmask(row)
        ids = _ascii(vocab, [t for t in allowed_token_ids(row) if t not in vocab.eos_token_ids])
        if not ids:
            return
        t = rng.choice(ids)
        assert m.accept_token(t)
        taken.append(t)


@pytest.mark.parametrize(("pattern", "alphabet"), CASES)
def test_shortest_completion_in_bytes_matches_the_reference(pattern, alphabet):
    pattern = _pattern(BYTES, pattern)
    for seed in range(2):
        for m, taken in _walks(BYTES, pattern, steps=12, seed=seed):
            text = _text(BYTES, taken)
            assert m.shortest_completion() == reference_shortest(pattern, text, alphabet), text


@pytest.mark.parametrize(("pattern", "alphabet"), CASES)
def test_shortest_completion_in_tokens_is_at_most_the_bytes(vocab, pattern, alphabet):
    pattern = _pattern(vocab, pattern)
    for seed in range(2):
        for m, taken in _walks(vocab, pattern, seed=seed):
            need = reference_shortest(pattern, _text(vocab, taken), alphabet)
            tokens = m.shortest_completion()
            assert (tokens == 0) == (need == 0) and tokens <= need


@pytest.mark.parametrize(("pattern", "alphabet"), STEERED)
def test_budgeted_masks_keep_exactly_the_tokens_that_fit(vocab, pattern, alphabet):
    pattern = _pattern(vocab, pattern)
    rng = random.Random(1)
    plain = grammars.allocate_bitmask(1, vocab.size)[0]
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    checked = 0
    for m, _ in _walks(vocab, pattern):
        need = m.shortest_completion()
        m.fill_bitmask(plain)
        words = [t for t in _ascii(vocab, allowed_token_ids(plain)) if t not in vocab.eos_token_ids]
        after = {}
        for t in rng.sample(words, min(len(words), 8)):
            assert m.accept_token(t)
            after[t] = m.shortest_completion()
            m.rollback(1)
        for budget in range(max(need - 2, 1), need + 3):
            steered = m.fill_bitmask_within(row, budget)
            kept = set(allowed_token_ids(row))
            assert kept <= set(allowed_token_ids(plain))
            assert steered == (not torch.equal(row, plain))
            fits = {t: n <= budget - 1 for t, n in after.items()}
            checked += len(fits)
            if steered:  # exactly the tokens that leave room to complete
                assert kept, "a steered mask allows some token"
                assert all((t in kept) == ok for t, ok in fits.items())
                assert bool(set(vocab.eos_token_ids) & kept) == (need == 0)
            else:  # every token fits, or (too late to close) none does
                assert all(fits.values()) or (budget < need and not any(fits.values()))
    assert checked


@pytest.mark.parametrize(("pattern", "alphabet"), STEERED)
def test_steered_walks_close_within_their_budget(vocab, pattern, alphabet):
    """From random points, random tokens under budgeted masks: every walk ends in a match
    (re.fullmatch) within the shortest completion plus a little."""
    pattern = _pattern(vocab, pattern)
    rng = random.Random(2)
    grammar = LazyRegexGrammar(pattern, vocab)
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    for _, prefix in _walks(vocab, pattern, steps=5):
        for _ in range(3):
            m = grammar.matcher()
            assert all(m.accept_token(t) for t in prefix)
            taken = list(prefix)
            budget = m.shortest_completion() + rng.randrange(3)
            for left in range(budget, 0, -1):
                m.fill_bitmask_within(row, left)
                t = rng.choice(allowed_token_ids(row))
                if t in vocab.eos_token_ids:
                    break
                assert m.accept_token(t)
                taken.append(t)
            assert reference_re.fullmatch(pattern, _text(vocab, taken)), _text(vocab, taken)


def test_without_single_byte_tokens_the_bound_stays_sound():
    # No token is "y" alone: "xy" is one token, but single-byte completions go through z.
    token_bytes = (b"xy", b"x", b"z", None)
    vocab = TokenVocabulary(token_bytes, frozenset({3}), "no-single-y")
    m = LazyRegexGrammar(r"xy|z{3}", vocab).matcher()
    assert m.shortest_completion() == 3  # an upper bound: "xy" takes one token
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    assert m.fill_bitmask_within(row, 1)
    assert allowed_token_ids(row) == [0]  # "xy" closes; "x" and "z" could not in time
    assert m.accept_token(2)
    assert m.shortest_completion() == 2


# Small enough for an outlines index (the grammar used where there is no C++ compiler).
INDEXED = [r"ab|cde", r"[ab]{2,5}c", r"(x|yz)*w", r'\{"k":(true|false|[0-9]{1,3})\}']


@pytest.mark.parametrize("pattern", INDEXED)
def test_the_outlines_index_counts_tokens_exactly_and_steers(vocab, pattern):
    """Its counts are exact in tokens: at most the lazy automaton's bound, zero exactly where
    that is; masks keep exactly the tokens whose next state fits; steered walks close."""
    grammar = RegexGrammar(build_index(pattern, vocab), vocab, pattern)
    rng = random.Random(3)
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    for lazy, prefix in _walks(vocab, pattern, steps=6):
        m = grammar.matcher()
        assert all(m.accept_token(t) for t in prefix)
        need = m.shortest_completion()
        assert need <= lazy.shortest_completion() and (need == 0) == (
            lazy.shortest_completion() == 0
        )
        for budget in range(max(need, 1), need + 3):
            steered = m.fill_bitmask_within(row, budget)
            kept = set(allowed_token_ids(row)) - set(vocab.eos_token_ids)
            m.fill_bitmask(row)
            plain = set(allowed_token_ids(row)) - set(vocab.eos_token_ids)
            for t in rng.sample(sorted(plain), min(len(plain), 8)):
                assert m.accept_token(t)
                fits = m.shortest_completion() <= budget - 1
                m.rollback(1)
                assert (t in kept) == fits
            assert steered == (kept != plain)
        # A walk under budgeted masks, from here, closes within `need` tokens.
        taken = list(prefix)
        for left in range(need, 0, -1):
            m.fill_bitmask_within(row, left)
            t = rng.choice(allowed_token_ids(row))
            if t in vocab.eos_token_ids:
                break
            assert m.accept_token(t)
            taken.append(t)
        assert reference_re.fullmatch(pattern, _text(vocab, taken))


def test_no_room_at_all_gives_the_plain_mask(vocab):
    """Drafted tokens may count past the output's room: a budget of 0 or less steers
    nothing."""
    m = LazyRegexGrammar(r"[ab]{2,5}c", vocab).matcher()
    plain = grammars.allocate_bitmask(1, vocab.size)[0]
    row = grammars.allocate_bitmask(1, vocab.size)[0]
    m.fill_bitmask(plain)
    for budget in (0, -3):
        assert not m.fill_bitmask_within(row, budget)
        assert torch.equal(row, plain)
